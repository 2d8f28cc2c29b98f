"""Generated job_submit.lua run by a real Lua runtime (lupa); generated policy checked against the
admissionregistration.k8s.io/v1 models of the official kubernetes client."""

from __future__ import annotations

import json

import pytest
import yaml
from kubernetes import client
from lupa import LuaRuntime

from producers.identity import DirectoryEntry
from producers.policy import PolicyOptions, lua_str, render_admission_policy, render_job_submit_lua
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
    assert p.spec.failure_policy == "Fail" and len(p.spec.validations) == 2
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
