"""Enforcement generated from the project registry: Slurm `job_submit.lua` and a Kubernetes
ValidatingAdmissionPolicy (+ binding) that reject a GPU job without a valid project, or naming a project
its submitter is not a member of (Kubernetes: where the request's user identity is the submitter's),
telling the user how to fix it. In grace mode both only warn (the producers then record the user's
default, source=DEFAULT).

Rendering is pure: registry + options in, text/objects out. Values are embedded as escaped literals,
never spliced as code.
"""

from __future__ import annotations

import copy
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from producers.identity import DirectoryEntry
from producers.projects import Mode, Registry

POLICY_NAME = "gpuledger-require-project"


@dataclass(frozen=True)
class PolicyOptions:
    mode: Mode = "strict"
    slurm_from: tuple[str, ...] = ("wckey", "comment:project", "account")
    account_map: Mapping[str, str] = field(default_factory=dict)
    kube_label: str = "gpuledger.io/project"
    gpu_only: bool = True
    help_url: str | None = None
    exempt_namespaces: tuple[str, ...] = ("kube-system", "kube-public", "kube-node-lease")
    # Strict mode: a GPU job naming no project, whose user has a default project (the registry's
    # `defaults`) they may use, gets that project set (in every wckey and comment:KEY place of
    # `slurm_from`) and runs, with a message, instead of being rejected. Slurm only.
    apply_default: bool = False


def _members(registry: Registry, directory: Mapping[str, DirectoryEntry] | None) -> dict[str, list[str] | None]:
    """project -> allowed users (None = open). Teams are expanded through the directory when given."""
    out: dict[str, list[str] | None] = {}
    for pid in registry.active_ids():
        p = registry.projects[pid]
        if not p.members and not p.teams:
            out[pid] = None
            continue
        users = set(p.members)
        if p.teams:
            if directory is None:
                out[pid] = None  # membership by team cannot be checked without a directory: open
                continue
            users |= {u for u, e in directory.items() if set(e.teams) & p.teams}
        out[pid] = sorted(users)
    return out


# ------------------------------------------------------------------------------------------------
# Slurm job_submit.lua


def lua_str(value: str) -> str:
    """A Lua string literal for any text (escaped byte by byte)."""
    out = ['"']
    for b in value.encode("utf-8"):
        ch = chr(b)
        if ch in '"\\':
            out.append("\\" + ch)
        elif 32 <= b < 127:
            out.append(ch)
        else:
            out.append(f"\\{b:03d}")
    out.append('"')
    return "".join(out)


def default_places(options: PolicyOptions) -> tuple[str, ...]:
    """Where `apply_default` writes the default project: every `wckey` and `comment:KEY` in `slurm_from`
    (an account is an association in Slurm, not a label job_submit.lua can set freely). Both, because
    slurmctld keeps a wckey only with `TrackWCKey=yes`, while the comment is always kept."""
    places = tuple(p for p in options.slurm_from if p == "wckey" or p.startswith("comment:"))
    if not places:
        sources = ", ".join(options.slurm_from)
        raise ValueError(f"apply_default needs wckey or comment:KEY among the project sources, not: {sources}")
    return places


def _how_to(options: PolicyOptions) -> str:
    place = options.slurm_from[0]
    if place == "wckey":
        how = "sbatch --wckey=<project>"
    elif place == "account":
        how = "sbatch --account=<account of the project>"
    else:
        key = place.split(":", 1)[1]
        how = f'sbatch --comment="{key}=<project>"'
    if options.help_url:
        how += f" (projects and how to join: {options.help_url})"
    return how


_LUA_BODY = r"""
local function log_user(msg)
  if slurm.log_user then slurm.log_user("%s", msg) end
end

local function comment_value(comment, key)
  if comment == nil then return nil end
  for k, v in string.gmatch(comment, "([%w_%.%-]+)[=:]([^,;%s]*)") do
    if string.lower(k) == key and v ~= "" then return v end
  end
  return nil
end

local function project_of(job_desc)
  for _, src in ipairs(SOURCES) do
    local value = nil
    if src == "wckey" then
      value = job_desc.wckey
      if value ~= nil then value = string.gsub(value, "^%*", "") end
    elseif src == "account" then
      local acct = job_desc.account
      if acct ~= nil and acct ~= "" then value = ACCOUNT_MAP[acct] or acct end
    else
      value = comment_value(job_desc.comment, string.sub(src, 9))
    end
    if value ~= nil and value ~= "" then return value, src end
  end
  return nil, nil
end

local function wants_gpu(job_desc)
  if not GPU_ONLY then return true end
  for _, f in ipairs({"tres_per_job", "tres_per_node", "tres_per_socket", "tres_per_task", "gres"}) do
    local v = job_desc[f]
    if v ~= nil and string.find(v, "gpu", 1, true) then return true end
  end
  return false
end

local function may_use(project, user)
  local members = PROJECTS[project]
  return members == true or (members ~= nil and user ~= nil and members[user] == true)
end

-- strict with APPLY_TO (the places to write): the user's default project, set on the job; nil when none
local function apply_default(job_desc, user)
  if #APPLY_TO == 0 or user == nil or project_of(job_desc) ~= nil then return nil end
  local default = DEFAULTS[user]
  if default == nil or not may_use(default, user) then return nil end
  for _, place in ipairs(APPLY_TO) do
    if place == "wckey" then
      job_desc.wckey = default
    else
      local pair = string.sub(place, 9) .. "=" .. default
      local comment = job_desc.comment
      if comment == nil or comment == "" then job_desc.comment = pair else job_desc.comment = comment .. "," .. pair end
    end
  end
  return default
end

local function user_projects(user)
  local mine = {}
  for pid, members in pairs(PROJECTS) do
    if members == true or (user ~= nil and members[user]) then table.insert(mine, pid) end
  end
  table.sort(mine)
  return table.concat(mine, ", ")
end

-- returns nil when the job may run, else the message telling the user how to fix it
local function check(job_desc, user)
  local project = project_of(job_desc)
  local default = user and DEFAULTS[user] or nil
  if project == nil then
    local msg = "gpuledger: this GPU job names no project. Set one with " .. HOW_TO .. "."
    local mine = user_projects(user)
    if mine ~= "" then msg = msg .. " Your projects: " .. mine .. "." end
    if default ~= nil then msg = msg .. " Your default is " .. default .. "." end
    return msg
  end
  local members = PROJECTS[project]
  if members == nil then
    local msg = "gpuledger: unknown project '" .. project .. "'. Set a valid one with " .. HOW_TO .. "."
    local mine = user_projects(user)
    if mine ~= "" then msg = msg .. " Your projects: " .. mine .. "." end
    return msg
  end
  if members ~= true and (user == nil or not members[user]) then
    local msg = "gpuledger: user " .. tostring(user) .. " is not a member of project '" .. project .. "'."
    local mine = user_projects(user)
    if mine ~= "" then msg = msg .. " Your projects: " .. mine .. "." end
    return msg .. " Ask the project owner to add you, or use " .. HOW_TO .. "."
  end
  return nil
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  if not wants_gpu(job_desc) then return slurm.SUCCESS end
  local msg = check(job_desc, job_desc.user_name)
  if msg == nil then return slurm.SUCCESS end
  if MODE == "strict" then
    local applied = apply_default(job_desc, job_desc.user_name)
    if applied ~= nil then
      log_user("gpuledger: this GPU job names no project; it is charged to your default project " .. applied ..
               ". To charge another, use " .. HOW_TO .. ".")
      return slurm.SUCCESS
    end
    log_user(msg)
    return slurm.ERROR
  end
  log_user(msg .. " (grace period: the job runs, charged to your default project)")
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  if MODE ~= "strict" then return slurm.SUCCESS end
  local project, src = project_of(job_desc)
  if project == nil then return slurm.SUCCESS end
  local user = job_desc.user_name
  if (user == nil or user == "") and job_rec ~= nil then user = job_rec.user_name end
  local msg = check(job_desc, user)
  if msg ~= nil then
    log_user(msg)
    return slurm.ERROR
  end
  return slurm.SUCCESS
end

if slurm.log_info then slurm.log_info("gpuledger job_submit.lua loaded (mode %s)", MODE) end
return slurm.SUCCESS
"""


def render_job_submit_lua(
    registry: Registry, options: PolicyOptions, directory: Mapping[str, DirectoryEntry] | None = None
) -> str:
    members = _members(registry, directory)
    lines = [
        "-- job_submit.lua generated by `gpuledger policy render` from the project registry. Do not edit:",
        "-- change the registry and render again. Rejects (strict) or warns about (grace) GPU jobs without a",
        "-- valid project.",
        f"local MODE = {lua_str(options.mode)}",
        f"local GPU_ONLY = {'true' if options.gpu_only else 'false'}",
        f"local HOW_TO = {lua_str(_how_to(options))}",
        "local SOURCES = {" + ", ".join(lua_str(s) for s in options.slurm_from) + "}",
        "local APPLY_TO = {"
        + (", ".join(lua_str(p) for p in default_places(options)) if options.apply_default else "")
        + "}",
        "local ACCOUNT_MAP = {",
        *(f"  [{lua_str(a)}] = {lua_str(p)}," for a, p in sorted(options.account_map.items())),
        "}",
        "local PROJECTS = {",
    ]
    for pid, users in members.items():
        if users is None:
            lines.append(f"  [{lua_str(pid)}] = true,")
        else:
            inner = ", ".join(f"[{lua_str(u)}] = true" for u in users)
            lines.append(f"  [{lua_str(pid)}] = {{{inner}}},")
    lines.append("}")
    lines.append("local DEFAULTS = {")
    lines.extend(f"  [{lua_str(u)}] = {lua_str(p)}," for u, p in sorted(registry.user_defaults.items()))
    lines.append("}")
    return "\n".join(lines) + "\n" + _LUA_BODY.lstrip("\n")


# ------------------------------------------------------------------------------------------------
# Kubernetes ValidatingAdmissionPolicy


_CEL_SIMPLE_ESCAPES = {
    "\\": "\\\\", "'": "\\'",
    "\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v",
}  # fmt: skip


def _cel_char(ch: str) -> str:
    if ch in _CEL_SIMPLE_ESCAPES:
        return _CEL_SIMPLE_ESCAPES[ch]
    code = ord(ch)
    if 0xD800 <= code <= 0xDFFF:  # a lone surrogate is no code point CEL (or YAML) can carry
        return "\\uFFFD"
    if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
        # Control, format (bidi overrides), private and unassigned characters, line and paragraph
        # separators: written as escapes, so the policy text shows exactly what it contains.
        return f"\\u{code:04X}" if code <= 0xFFFF else f"\\U{code:08X}"
    return ch


def cel_str(value: str) -> str:
    """A single-quoted CEL string literal for any text: quotes, backslashes and every control
    character escaped as the CEL language definition allows (`\\n`, `\\uXXXX`, `\\UXXXXXXXX`)."""
    return "'" + "".join(_cel_char(ch) for ch in value) + "'"


def _cel_list(values: Sequence[str]) -> str:
    return "[" + ", ".join(cel_str(v) for v in values) + "]"


def _cel_members(members: Mapping[str, list[str] | None]) -> str:
    """CEL map literal project -> its members, for the projects that restrict membership."""
    inner = ", ".join(f"{cel_str(pid)}: {_cel_list(users)}" for pid, users in members.items() if users is not None)
    return "{" + inner + "}"


# Membership is checked where the request names the person: a user (or a service account listed as a
# member) creating the workload. Requests made by the cluster itself (`system:` identities: the Job and
# JobSet controllers creating pods, nodes) carry a controller's identity, not the submitter's; their
# parent object was checked when the person created it, and the producers record a non-member's project
# as claimed either way.
_IDENTITY_KNOWN = "!request.userInfo.username.startsWith('system:')"


# What the policy looks at: pods, and the Jobs and JobSets whose pod templates they come from.
_MATCH_RULES = [
    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]},
    {"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
     "resources": ["jobs"]},
    {"apiGroups": ["jobset.x-k8s.io"], "apiVersions": ["v1alpha2"],
     "operations": ["CREATE", "UPDATE"], "resources": ["jobsets"]},
]


def _policy_metadata() -> dict[str, Any]:
    return {"name": POLICY_NAME, "labels": {"app.kubernetes.io/managed-by": "gpuledger"}}


def _policy_variables(label: str, projects: list[str], members: Mapping[str, list[str] | None]) -> list[dict[str, str]]:
    """The CEL variables: the pod specs of the object, whether any container asks for a GPU, the
    project it names (on the object, or a Job's pod template), the known projects and their members."""
    gpu_resource = "k.startsWith('nvidia.com/')"
    wants_gpu = (
        "variables.podSpecs.exists(s, s.containers.exists(c, has(c.resources) && ("
        f"(has(c.resources.limits) && c.resources.limits.exists(k, {gpu_resource})) || "
        f"(has(c.resources.requests) && c.resources.requests.exists(k, {gpu_resource})))))"
    )
    return [
        {
            "name": "podSpecs",
            "expression": (
                "object.kind == 'Pod' ? [object.spec] : "
                "object.kind == 'Job' ? [object.spec.template.spec] : "
                "object.kind == 'JobSet' ? object.spec.replicatedJobs.map(r, r.template.spec.template.spec) "
                ": []"
            ),
        },
        {"name": "wantsGpu", "expression": wants_gpu},
        {
            "name": "project",
            "expression": (
                f"has(object.metadata.labels) && {cel_str(label)} in object.metadata.labels ? "
                f"object.metadata.labels[{cel_str(label)}] : "
                f"(object.kind == 'Job' && has(object.spec.template.metadata) && "
                f"has(object.spec.template.metadata.labels) && "
                f"{cel_str(label)} in object.spec.template.metadata.labels ? "
                f"object.spec.template.metadata.labels[{cel_str(label)}] : '')"
            ),
        },
        {"name": "projects", "expression": _cel_list(projects)},
        {"name": "members", "expression": _cel_members(members)},
        {"name": "user", "expression": "request.userInfo.username"},
    ]


def _policy_validations(hint: str, known: str) -> list[dict[str, str]]:
    """A GPU workload names a project (Invalid), a known one (Invalid), and one its submitter is a
    member of (Forbidden), each refusal with the hint on how to put it right."""
    return [
        {
            "expression": "!variables.wantsGpu || variables.project != ''",
            "messageExpression": cel_str(f"gpuledger: this GPU workload names no project. {hint}"),
            "reason": "Invalid",
        },
        {
            "expression": (
                "!variables.wantsGpu || variables.project == '' || variables.project in variables.projects"
            ),
            "messageExpression": (
                cel_str("gpuledger: unknown project '")
                + " + variables.project + "
                + cel_str(f"'. Use one of: {known}. {hint}")
            ),
            "reason": "Invalid",
        },
        {
            "expression": (
                "!variables.wantsGpu || !(variables.project in variables.members) || "
                "variables.user in variables.members[variables.project] || "
                f"!({_IDENTITY_KNOWN})"
            ),
            "messageExpression": (
                cel_str("gpuledger: user ")
                + " + variables.user + "
                + cel_str(" is not a member of project '")
                + " + variables.project + "
                + cel_str(f"'. Ask the project owner to add you, or name one of your projects. {hint}")
            ),
            "reason": "Forbidden",
        },
    ]


def _policy_binding(options: PolicyOptions) -> dict[str, Any]:
    """Deny in strict mode, else warn and audit; never in the exempt namespaces."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": _policy_metadata(),
        "spec": {
            "policyName": POLICY_NAME,
            "validationActions": ["Deny"] if options.mode == "strict" else ["Warn", "Audit"],
            "matchResources": {
                "namespaceSelector": {
                    "matchExpressions": [
                        {
                            "key": "kubernetes.io/metadata.name",
                            "operator": "NotIn",
                            "values": list(options.exempt_namespaces),
                        }
                    ]
                }
            },
        },
    }


def render_admission_policy(
    registry: Registry, options: PolicyOptions, directory: Mapping[str, DirectoryEntry] | None = None
) -> list[dict[str, Any]]:
    """A ValidatingAdmissionPolicy and its binding (admissionregistration.k8s.io/v1). Team-based
    membership is expanded through `directory`; without one, such a project is open (as in Lua)."""
    label = options.kube_label
    projects = registry.active_ids()
    hint = f"Add the label {label}=<project> to the workload (and its pod template)."
    if options.help_url:
        hint += f" Projects and how to join: {options.help_url}"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": _policy_metadata(),
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": copy.deepcopy(_MATCH_RULES)},
            "variables": _policy_variables(label, projects, _members(registry, directory)),
            "validations": _policy_validations(hint, ", ".join(projects)),
        },
    }
    return [policy, _policy_binding(options)]


def render_admission_policy_yaml(
    registry: Registry, options: PolicyOptions, directory: Mapping[str, DirectoryEntry] | None = None
) -> str:
    return yaml.safe_dump_all(render_admission_policy(registry, options, directory), sort_keys=False, width=200)
