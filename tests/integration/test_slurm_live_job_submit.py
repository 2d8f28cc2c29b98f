"""The rendered job_submit.lua (`gpuledger policy render`) loaded by the live slurmctld (JobSubmitPlugins=lua,
re-read at `scontrol reconfigure`): what users see is sbatch's own output.

Strict rejects a GPU job that names no project, an unknown project, or a project the user is not a member
of, with the policy's message on sbatch's stderr; a job with a good project, and a CPU job, are accepted.
Grace lets the job without a project through, with the message as a warning.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
import yaml
from fixtures_cli import run_gpuledger

from stack.slurm.cluster import ACCEPT_ALL_LUA, SlurmClient

REGISTRY = {
    "projects": [
        {"id": "atlas", "cost_centre": "CC-1", "members": ["root"]},
        {"id": "vision", "cost_centre": "CC-2", "members": ["alice"]},
    ],
    "defaults": {"root": "atlas"},
}


@pytest.fixture
def render(slurm: SlurmClient, tmp_path: Path) -> Iterator[object]:
    """render(mode, *flags, data=registry): `gpuledger policy render --mode MODE FLAGS` into the cluster's
    job_submit.lua, reloaded. The accept-all script is back after the test."""

    def load(mode: str, *flags: str, data: Mapping[str, object] = REGISTRY) -> str:
        out = tmp_path / f"{mode}-{len(list(tmp_path.iterdir()))}"
        registry = out.with_suffix(".yaml")
        registry.write_text(yaml.safe_dump(dict(data)), encoding="utf-8")
        proc = run_gpuledger(["policy", "render", "--registry", str(registry), "--out", str(out), "--mode", mode,
                              *flags, "--state-dir", str(tmp_path / "state")], slurm.env)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        lua = (out / "job_submit.lua").read_text(encoding="utf-8")
        slurm.reconfigure(lua)
        return lua

    yield load
    slurm.reconfigure(ACCEPT_ALL_LUA)


def test_strict_rejects_at_sbatch_with_the_reason(slurm: SlurmClient, render: object) -> None:
    lua = render("strict")  # type: ignore[operator]
    assert 'local MODE = "strict"' in lua and slurm.cfg.job_submit_lua.read_text(encoding="utf-8") == lua

    nothing = slurm.sbatch("--gres=gpu:h100:1")
    assert nothing.job_id is None and nothing.returncode != 0
    assert "gpuledger: this GPU job names no project" in nothing.stderr
    assert "Your projects: atlas." in nothing.stderr and "Your default is atlas." in nothing.stderr

    unknown = slurm.sbatch("--gres=gpu:a100:1", "--comment", "project=nope")
    assert unknown.job_id is None and "gpuledger: unknown project 'nope'" in unknown.stderr
    other = slurm.sbatch("--gres=gpu:a100:1", "--comment", "project=vision")
    assert other.job_id is None and "is not a member of project 'vision'" in other.stderr

    good = slurm.sbatch("--gres=gpu:h100:1", "--comment", "project=atlas")
    assert good.job_id is not None, good.stderr
    assert slurm.wait_for_state(good.job_id, "RUNNING") == "RUNNING"
    cpu = slurm.sbatch()  # no GPU: not the policy's business
    assert cpu.job_id is not None, cpu.stderr


def test_grace_lets_the_job_through_with_the_warning(slurm: SlurmClient, render: object) -> None:
    render("grace")  # type: ignore[operator]
    sub = slurm.sbatch("--gres=gpu:h100:1")
    assert sub.job_id is not None, sub.stderr
    assert "gpuledger: this GPU job names no project" in sub.stderr and "grace period" in sub.stderr
    assert slurm.wait_for_state(sub.job_id, "RUNNING") == "RUNNING"
    unknown = slurm.sbatch("--gres=gpu:a100:1", "--comment", "project=nope")
    assert unknown.job_id is not None and "unknown project 'nope'" in unknown.stderr


def test_strict_with_apply_default_sets_the_default_project(slurm: SlurmClient, render: object) -> None:
    """`--apply-default`: the job naming no project runs with the user's default set by the script, in its
    comment as Slurm itself records it; an explicitly wrong project is still refused."""
    lua = render("strict", "--apply-default")  # type: ignore[operator]
    assert 'local APPLY_TO = {"wckey", "comment:project"}' in lua
    sub = slurm.sbatch("--gres=gpu:h100:1")
    assert sub.job_id is not None, sub.stderr
    assert "charged to your default project atlas" in sub.stderr
    # slurmctld keeps the comment (the wckey only with TrackWCKey=yes, which this cluster does not set).
    assert slurm.run("squeue", "-h", "-o", "%k", "-j", sub.job_id).stdout.strip() == "project=atlas"
    assert slurm.show_job(sub.job_id)["Comment"] == "project=atlas"
    assert slurm.wait_for_state(sub.job_id, "RUNNING") == "RUNNING"
    unknown = slurm.sbatch("--gres=gpu:a100:1", "--wckey", "nope")
    assert unknown.job_id is None and "gpuledger: unknown project 'nope'" in unknown.stderr


def test_strict_with_apply_default_rejects_a_user_without_default(slurm: SlurmClient, render: object) -> None:
    """The same option with a registry where the submitting user (root) has no default: rejected."""
    render("strict", "--apply-default", data={**REGISTRY, "defaults": {"alice": "vision"}})  # type: ignore[operator]
    sub = slurm.sbatch("--gres=gpu:h100:1")
    assert sub.job_id is None and sub.returncode != 0
    assert "gpuledger: this GPU job names no project" in sub.stderr and "Your default" not in sub.stderr


def test_accept_all_again_after_reconfigure(slurm: SlurmClient, render: object) -> None:
    """`reconfigure` really reloads: strict rejects, the accept-all script accepts the same submission."""
    render("strict")  # type: ignore[operator]
    assert slurm.sbatch("--gres=gpu:h100:1").job_id is None
    slurm.reconfigure(ACCEPT_ALL_LUA)
    accepted = slurm.sbatch("--gres=gpu:h100:1")
    assert accepted.job_id is not None and accepted.stderr == "", accepted.stderr
