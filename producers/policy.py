"""Enforcement generated from the project registry: Slurm `job_submit.lua` and a Kubernetes
ValidatingAdmissionPolicy (+ binding) that reject a GPU job without a valid project, telling the user how
to fix it. In grace mode both only warn (the producers then record the user's default, source=DEFAULT).

Rendering is pure: registry + options in, text/objects out. Values are embedded as escaped literals,
never spliced as code.
"""

from __future__ import annotations

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


def cel_str(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _cel_list(values: Sequence[str]) -> str:
    return "[" + ", ".join(cel_str(v) for v in values) + "]"


def render_admission_policy(registry: Registry, options: PolicyOptions) -> list[dict[str, Any]]:
    """A ValidatingAdmissionPolicy and its binding (admissionregistration.k8s.io/v1)."""
    label = options.kube_label
    projects = registry.active_ids()
    hint = f"Add the label {label}=<project> to the workload (and its pod template)."
    if options.help_url:
        hint += f" Projects and how to join: {options.help_url}"
    known = ", ".join(projects)
    gpu_resource = "k.startsWith('nvidia.com/')"
    wants_gpu = (
        "variables.podSpecs.exists(s, s.containers.exists(c, has(c.resources) && ("
        f"(has(c.resources.limits) && c.resources.limits.exists(k, {gpu_resource})) || "
        f"(has(c.resources.requests) && c.resources.requests.exists(k, {gpu_resource})))))"
    )
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": POLICY_NAME, "labels": {"app.kubernetes.io/managed-by": "gpuledger"}},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]},
                    {"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                     "resources": ["jobs"]},
                    {"apiGroups": ["jobset.x-k8s.io"], "apiVersions": ["v1alpha2"],
                     "operations": ["CREATE", "UPDATE"], "resources": ["jobsets"]},
                ]
            },
            "variables": [
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
            ],
            "validations": [
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
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": POLICY_NAME, "labels": {"app.kubernetes.io/managed-by": "gpuledger"}},
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
    return [policy, binding]


def render_admission_policy_yaml(registry: Registry, options: PolicyOptions) -> str:
    return yaml.safe_dump_all(render_admission_policy(registry, options), sort_keys=False, width=200)
