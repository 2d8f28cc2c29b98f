"""Generated job_submit.lua run by a real Lua runtime (lupa); generated policy checked against the
admissionregistration.k8s.io/v1 models of the official kubernetes client."""

from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from kubernetes import client
from lupa import LuaRuntime

from producers.identity import DirectoryEntry
from producers.policy import (
    PolicyOptions,
    cel_str,
    lua_str,
    render_admission_policy,
    render_admission_policy_yaml,
    render_job_submit_lua,
)
from producers.projects import registry_from_data

REGISTRY = registry_from_data(
    {
        "projects": [
            {"id": "atlas", "cost_centre": "CC-100", "members": ["alice", "bob"]},
            {"id": "open-science", "cost_centre": "CC-200"},
            {"id": "vision", "teams": ["cv-team"]},
            {"id": "retired", "active": False},
        ],
        "defaults": {"alice": "atlas", "carol": "open-science"},
    }
)
DIRECTORY = {"dave": DirectoryEntry("dave", teams=("cv-team",))}

SLURM_SUCCESS, SLURM_ERROR = 0, -1


def load(options: PolicyOptions):
    lua = LuaRuntime(unpack_returned_tuples=True)
    messages: list[str] = []
    lua.execute("slurm = {SUCCESS = 0, ERROR = -1}")
    slurm = lua.globals().slurm
    slurm.log_user = lambda fmt, *args: messages.append(lua.globals().string.format(fmt, *args))
    slurm.log_info = lambda *a: None
    assert lua.execute(render_job_submit_lua(REGISTRY, options, DIRECTORY)) == SLURM_SUCCESS
    g = lua.globals()

    def submit(**fields):
        messages.clear()
        rc = g.slurm_job_submit(lua.table_from(fields), lua.table(), 1000)
        return rc, list(messages)

    def modify(job_rec: dict, **fields):
        messages.clear()
        rc = g.slurm_job_modify(lua.table_from(fields), lua.table_from(job_rec), lua.table(), 0)
        return rc, list(messages)

    return submit, modify


GPU = {"tres_per_node": "gres/gpu:4"}


def test_strict_accepts_valid_project_from_wckey():
    submit, _ = load(PolicyOptions(mode="strict"))
    assert submit(user_name="alice", wckey="atlas", **GPU) == (SLURM_SUCCESS, [])
    assert submit(user_name="erin", wckey="open-science", **GPU) == (SLURM_SUCCESS, [])
    assert submit(user_name="dave", wckey="vision", **GPU) == (SLURM_SUCCESS, [])  # team via directory


def test_strict_rejects_missing_project_and_says_how_to_fix():
    submit, _ = load(PolicyOptions(mode="strict", help_url="https://wiki.example/projects"))
    rc, (msg,) = submit(user_name="alice", **GPU)
    assert rc == SLURM_ERROR
    assert "sbatch --wckey=<project>" in msg and "Your projects: atlas, open-science" in msg
    assert "Your default is atlas" in msg and "https://wiki.example/projects" in msg


def test_strict_rejects_unknown_retired_and_non_member():
    submit, _ = load(PolicyOptions(mode="strict"))
    rc, (msg,) = submit(user_name="alice", wckey="nope", **GPU)
    assert rc == SLURM_ERROR and "unknown project 'nope'" in msg
    rc, _ = submit(user_name="alice", wckey="retired", **GPU)
    assert rc == SLURM_ERROR
    rc, (msg,) = submit(user_name="mallory", wckey="atlas", **GPU)
    assert rc == SLURM_ERROR and "not a member of project 'atlas'" in msg


def test_non_gpu_jobs_pass_when_gpu_only():
    submit, _ = load(PolicyOptions(mode="strict"))
    assert submit(user_name="alice")[0] == SLURM_SUCCESS
    assert submit(user_name="alice", gres="gpu:1")[0] == SLURM_ERROR  # old-style --gres
    submit_all, _ = load(PolicyOptions(mode="strict", gpu_only=False))
    assert submit_all(user_name="alice")[0] == SLURM_ERROR


def test_comment_key_and_account_map_sources():
    submit, _ = load(PolicyOptions(mode="strict", slurm_from=("comment:project", "account"),
                                   account_map={"phys-gpu": "atlas"}))
    assert submit(user_name="bob", comment="project=atlas,checkpoint=yes", **GPU)[0] == SLURM_SUCCESS
    assert submit(user_name="bob", account="phys-gpu", **GPU)[0] == SLURM_SUCCESS
    rc, (msg,) = submit(user_name="bob", account="chem", **GPU)
    assert rc == SLURM_ERROR and "unknown project 'chem'" in msg
    rc, (msg,) = submit(user_name="bob", comment="nothing here", **GPU)
    assert rc == SLURM_ERROR and 'sbatch --comment="project=<project>"' in msg


def test_grace_warns_but_accepts():
    submit, _ = load(PolicyOptions(mode="grace"))
    rc, (msg,) = submit(user_name="alice", **GPU)
    assert rc == SLURM_SUCCESS and "grace period" in msg


def test_modify_to_invalid_project_is_rejected_in_strict():
    _, modify = load(PolicyOptions(mode="strict"))
    assert modify({"user_name": "alice"}, wckey="atlas")[0] == SLURM_SUCCESS
    assert modify({"user_name": "alice"}, wckey="bogus")[0] == SLURM_ERROR
    assert modify({"user_name": "alice"}, time_limit=10)[0] == SLURM_SUCCESS


def test_lua_strings_are_escaped():
    lua = LuaRuntime(encoding=None)
    nasty = 'a"b\\c\n]]--é'
    assert lua.eval(lua_str(nasty)) == nasty.encode()
    lua2 = LuaRuntime()
    assert lua2.eval(lua_str("plain")) == "plain"


# Every control character, quotes, backslashes, Lua/CEL syntax, bidi overrides, separators, astral.
NASTY = "".join(map(chr, range(0x20))) + "\x7f\x85\xa0'\"\\`?]]--[[ %s ${x} \u202e\u2028\u2029\ufeff\U0001f600 é"


def test_lua_strings_escape_every_control_character():
    literal = lua_str(NASTY)
    assert literal.isascii() and all(32 <= ord(c) < 127 for c in literal)  # one printable line
    assert LuaRuntime(encoding=None).eval(literal) == NASTY.encode()
    for ch in map(chr, range(0x80)):  # each one alone, and before a digit (`\0` + `1` is not `\01`)
        assert LuaRuntime(encoding=None).eval(lua_str(ch + "1")) == (ch + "1").encode()


def test_job_submit_lua_carries_hostile_text_as_data():
    help_url = "https://wiki.example/gpu?a=1\n]] os.exit(1) --[[\r\x00"
    submit, _ = load(PolicyOptions(help_url=help_url, slurm_from=('comment:pro"ject',)))
    rc, (msg,) = submit(user_name="alice", **GPU)
    assert rc == SLURM_ERROR and help_url in msg and 'sbatch --comment="pro"ject=<project>"' in msg


# The CEL language definition's string literal (single-quoted, not raw, not triple-quoted):
# any character but the quote, a backslash, CR and LF, or one of these escapes.
_CEL_ESCAPE = r"""\\(?:[abfnrtv\\?"'`]|[xX][0-9A-Fa-f]{2}|u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8}|[0-3][0-7]{2})"""
_CEL_STRING = re.compile(rf"'(?:[^'\\\r\n]|{_CEL_ESCAPE})*'")
_CEL_SIMPLE = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}


def _cel_decode(literal: str) -> str:
    """What a CEL parser reads from a string literal, per the language definition."""
    assert _CEL_STRING.fullmatch(literal), literal

    def one(m: re.Match[str]) -> str:
        esc = m.group(0)[1:]
        if esc[0] in "xXuU":
            return chr(int(esc[1:], 16))
        if esc[0].isdigit():
            return chr(int(esc, 8))
        return _CEL_SIMPLE.get(esc, esc)

    return re.sub(_CEL_ESCAPE, one, literal[1:-1])


def test_cel_strings_escape_every_control_character():
    import celpy

    literal = cel_str(NASTY)
    assert _cel_decode(literal) == NASTY
    env = celpy.Environment()  # and a real CEL implementation reads the same text
    assert str(env.program(env.compile(literal)).evaluate({})) == NASTY
    shown = literal[1:-1]
    assert not any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in shown), ascii(literal)
    assert "\\u202E" in shown and "\\n" in shown and "\\u0000" in shown and "é" in shown  # readable where safe


@given(st.text())
def test_cel_strings_round_trip_any_text(text):
    assert _cel_decode(cel_str(text)) == text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def test_admission_policy_with_hostile_text_stays_one_valid_literal():
    help_url = "https://wiki.example/gpu?x=1'\n|| true || '\u2028"
    policy, _ = render_admission_policy(REGISTRY, PolicyOptions(help_url=help_url, kube_label="gpuledger.io/pro'ject"))
    messages = {v["messageExpression"] for v in policy["spec"]["validations"]}
    missing = next(m for m in messages if "names no project" in m)
    assert _cel_decode(missing).endswith(f"Projects and how to join: {help_url}")
    unknown = next(m for m in messages if "unknown project" in m)
    head, tail = unknown.split(" + variables.project + ")
    assert _cel_decode(head) == "gpuledger: unknown project '" and help_url in _cel_decode(tail)
    label = next(v["expression"] for v in policy["spec"]["variables"] if v["name"] == "project")
    assert cel_str("gpuledger.io/pro'ject") in label and "pro'ject" not in label
    docs = list(yaml.safe_load_all(render_admission_policy_yaml(REGISTRY, PolicyOptions(help_url=help_url))))
    assert docs[0]["spec"]["validations"][0]["messageExpression"] == cel_str(
        f"gpuledger: this GPU workload names no project. Add the label gpuledger.io/project=<project> to the "
        f"workload (and its pod template). Projects and how to join: {help_url}"
    )


# ------------------------------------------------------------------------------------------------
# ValidatingAdmissionPolicy


def _strict_check(obj, model_cls, path="$"):
    """Every key of `obj` must be a field of the client model (deserialize alone ignores unknown keys)."""
    inst = client.ApiClient().deserialize(json.dumps(obj), model_cls.__name__, "application/json")
    _walk(obj, type(inst), path)
    return inst


def _walk(obj, cls, path):
    attr = {v: k for k, v in cls.attribute_map.items()}
    for key, value in obj.items():
        assert key in attr, f"{path}.{key} is not a field of {cls.__name__}"
        typ = cls.openapi_types[attr[key]]
        inner = typ[5:-1] if typ.lower().startswith("list[") else typ
        if hasattr(client, inner) and isinstance(value, list | dict):
            for i, item in enumerate(value if isinstance(value, list) else [value]):
                _walk(item, getattr(client, inner), f"{path}.{key}[{i}]")


@pytest.mark.parametrize("mode,actions", [("strict", ["Deny"]), ("grace", ["Warn", "Audit"])])
def test_admission_policy_matches_v1_schema(mode, actions):
    policy, binding = render_admission_policy(REGISTRY, PolicyOptions(mode=mode))
    p = _strict_check(policy, client.V1ValidatingAdmissionPolicy)
    b = _strict_check(binding, client.V1ValidatingAdmissionPolicyBinding)
    assert p.spec.failure_policy == "Fail" and len(p.spec.validations) == 3
    assert {r.resources[0] for r in p.spec.match_constraints.resource_rules} == {"pods", "jobs", "jobsets"}
    assert b.spec.policy_name == p.metadata.name and b.spec.validation_actions == actions
    projects = next(v for v in p.spec.variables if v.name == "projects").expression
    assert projects == "['atlas', 'open-science', 'vision']"  # retired projects are not offered
    assert "gpuledger.io/project" in p.spec.validations[0].message_expression


def test_admission_policy_yaml_round_trips():
    from producers.policy import render_admission_policy_yaml

    docs = list(yaml.safe_load_all(render_admission_policy_yaml(REGISTRY, PolicyOptions())))
    assert [d["kind"] for d in docs] == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]


def test_schema_check_catches_unknown_fields():
    policy, _ = render_admission_policy(REGISTRY, PolicyOptions())
    policy["spec"]["validations"][0]["mesage"] = "typo"
    with pytest.raises(AssertionError, match="mesage"):
        _strict_check(policy, client.V1ValidatingAdmissionPolicy)


def test_policy_render_command_writes_both_files(tmp_path, monkeypatch):
    import typer
    from typer.testing import CliRunner

    from producers import scheduler_cli

    reg = tmp_path / "projects.yaml"
    reg.write_text("projects:\n  - id: atlas\n    members: [alice]\ndefaults:\n  alice: atlas\n")
    monkeypatch.chdir(tmp_path)
    app, inspect_app = typer.Typer(), typer.Typer()
    scheduler_cli.register(app, inspect_app)
    res = CliRunner().invoke(app, ["policy", "render", "--registry", str(reg), "--out", str(tmp_path / "out"),
                                   "--mode", "strict"])
    assert res.exit_code == 0, res.output
    lua_text = (tmp_path / "out" / "job_submit.lua").read_text()
    lua = LuaRuntime()
    lua.execute("slurm = {SUCCESS = 0, ERROR = -1, log_user = function() end}")
    lua.execute(lua_text)
    rc = lua.globals().slurm_job_submit(lua.table_from({"user_name": "alice", "tres_per_job": "gres/gpu:1"}),
                                        lua.table(), 0)
    assert rc == SLURM_ERROR
    docs = list(yaml.safe_load_all((tmp_path / "out" / "gpuledger-admission-policy.yaml").read_text()))
    _strict_check(docs[0], client.V1ValidatingAdmissionPolicy)


# ------------------------------------------------------------------------------------------------
# The admission policy's CEL, evaluated (cel-python) as the API server would for a request


def _admit(policy: dict, obj: dict, username: str) -> list[str]:
    """The messages of the validations a request fails (empty: admitted)."""
    import celpy
    from celpy import celtypes

    env = celpy.Environment()

    def ev(expr: str, act: dict):
        return env.program(env.compile(expr)).evaluate(act)

    act = {"object": celpy.json_to_cel(obj), "request": celpy.json_to_cel({"userInfo": {"username": username}})}
    variables = celtypes.MapType({})
    for v in policy["spec"]["variables"]:
        variables[celtypes.StringType(v["name"])] = ev(v["expression"], {**act, "variables": variables})
    act["variables"] = variables
    return [str(ev(v["messageExpression"], act)) for v in policy["spec"]["validations"] if not ev(v["expression"], act)]


def _gpu_job(project: str | None) -> dict:
    labels = {"gpuledger.io/project": project} if project else {}
    container = {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    return {"kind": "Job", "metadata": {"name": "j", "labels": labels},
            "spec": {"template": {"metadata": {}, "spec": {"containers": [container]}}}}  # fmt: skip


def test_admission_policy_checks_membership_where_the_user_is_known():
    """Worked example, registry above: atlas admits alice and bob; vision admits team cv-team (dave, through
    the directory); open-science admits everyone."""
    policy, _ = render_admission_policy(REGISTRY, PolicyOptions(mode="strict"), DIRECTORY)
    members = next(v for v in policy["spec"]["variables"] if v["name"] == "members")["expression"]
    assert members == "{'atlas': ['alice', 'bob'], 'vision': ['dave']}"
    cases = {
        ("alice", "atlas"): [], ("bob", "atlas"): [], ("dave", "vision"): [], ("mallory", "open-science"): [],
        ("mallory", "atlas"): ["gpuledger: user mallory is not a member of project 'atlas'."],
        ("alice", "vision"): ["gpuledger: user alice is not a member of project 'vision'."],
        # a controller creating the Job's pods is not the submitter: membership was checked on the Job
        ("system:serviceaccount:kube-system:job-controller", "atlas"): [],
        ("mallory", "nope"): ["gpuledger: unknown project 'nope'."],
        ("mallory", None): ["gpuledger: this GPU workload names no project."],
    }  # fmt: skip
    for (user, project), expected in cases.items():
        got = _admit(policy, _gpu_job(project), user)
        assert [m[: len(e)] for m, e in zip(got, expected, strict=False)] == expected and len(got) == len(expected), (
            user, project, got)  # fmt: skip
    # Without a directory, membership by team cannot be checked: vision is open, as in job_submit.lua.
    open_vision, _ = render_admission_policy(REGISTRY, PolicyOptions())
    assert _admit(open_vision, _gpu_job("vision"), "alice") == []
    assert _admit(open_vision, _gpu_job("atlas"), "mallory") != []


def _submit_keeping_job(options: PolicyOptions, **fields: object) -> tuple[int, list[str], object, object]:
    """slurm_job_submit on a job table that is read back afterwards: (rc, messages, wckey, comment)."""
    lua = LuaRuntime(unpack_returned_tuples=True)
    messages: list[str] = []
    lua.execute("slurm = {SUCCESS = 0, ERROR = -1}")
    lua.globals().slurm.log_user = lambda fmt, *args: messages.append(lua.globals().string.format(fmt, *args))
    lua.execute(render_job_submit_lua(REGISTRY, options, DIRECTORY))
    job = lua.table_from(fields)
    rc = lua.globals().slurm_job_submit(job, lua.table(), 1000)
    return rc, messages, job["wckey"], job["comment"]


def test_apply_default_sets_the_users_default_project_instead_of_rejecting() -> None:
    strict = PolicyOptions(mode="strict", apply_default=True)
    # Every place the project is read from that a script can write: the wckey and the comment.
    assert 'local APPLY_TO = {"wckey", "comment:project"}' in render_job_submit_lua(REGISTRY, strict, DIRECTORY)
    rc, (msg,), wckey, comment = _submit_keeping_job(strict, user_name="alice", **GPU)
    assert (rc, wckey, comment) == (SLURM_SUCCESS, "atlas", "project=atlas")
    assert "charged to your default project atlas" in msg and "sbatch --wckey=<project>" in msg
    # The comment only, appended to what the user wrote.
    in_comment = PolicyOptions(mode="strict", apply_default=True, slurm_from=("comment:project", "account"))
    rc, _, wckey, comment = _submit_keeping_job(in_comment, user_name="carol", comment="run 7", **GPU)
    assert (rc, wckey, comment) == (SLURM_SUCCESS, None, "run 7,project=open-science")
    assert "local APPLY_TO = {}" in render_job_submit_lua(REGISTRY, PolicyOptions(mode="strict"), DIRECTORY)


def test_apply_default_still_rejects_no_default_and_a_wrong_project() -> None:
    strict = PolicyOptions(mode="strict", apply_default=True)
    rc, (msg,), wckey, _ = _submit_keeping_job(strict, user_name="erin", **GPU)  # no default
    assert (rc, wckey) == (SLURM_ERROR, None) and "names no project" in msg
    rc, (msg,), wckey, _ = _submit_keeping_job(strict, user_name="alice", wckey="nope", **GPU)
    assert (rc, wckey) == (SLURM_ERROR, "nope") and "unknown project 'nope'" in msg
    rc, (msg,), _, _ = _submit_keeping_job(strict, user_name="alice", wckey="vision", **GPU)
    assert rc == SLURM_ERROR and "not a member of project 'vision'" in msg
    # Off by default: the same job without the option is rejected.
    assert _submit_keeping_job(PolicyOptions(mode="strict"), user_name="alice", **GPU)[0] == SLURM_ERROR


def test_apply_default_needs_a_place_it_can_write_and_escapes_it() -> None:
    with pytest.raises(ValueError, match="wckey or comment:KEY"):
        render_job_submit_lua(REGISTRY, PolicyOptions(apply_default=True, slurm_from=("account",)))
    odd = PolicyOptions(apply_default=True, slurm_from=('comment:pro"ject',))
    assert r'local APPLY_TO = {"comment:pro\"ject"}' in render_job_submit_lua(REGISTRY, odd, DIRECTORY)


def test_policy_render_apply_default_without_a_writable_place_renders_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import typer
    from typer.testing import CliRunner

    from producers import scheduler_cli

    reg = tmp_path / "projects.yaml"
    reg.write_text("projects:\n  - id: atlas\n    members: [alice]\ndefaults:\n  alice: atlas\n")
    monkeypatch.setenv("GPULEDGER_SCHEDULER__PROJECT_FROM", '["account"]')
    app, inspect_app = typer.Typer(), typer.Typer()
    scheduler_cli.register(app, inspect_app)
    argv = ["policy", "render", "--registry", str(reg), "--out", str(tmp_path / "out"), "--mode", "strict",
            "--apply-default", "--state-dir", str(tmp_path / "s")]  # fmt: skip
    res = CliRunner().invoke(app, argv)
    assert res.exit_code != 0 and "needs wckey or comment:KEY" in str(res.exception)
    assert not (tmp_path / "out").exists()
