"""`up` on the simulator runs with the simulated organisation's policy unless one is configured or the source is
real; what it prints to try next is typed the way the folder it ran in reaches `gpuledger`."""

from __future__ import annotations

from pathlib import Path

import pytest

from base.settings import Settings
from producers.simulator.org import sim_policy_text
from stack import components
from stack.components import SIM_POLICY, by_name, demo_policy, with_demo_policy
from stack.present import command_prefix, next_steps
from stack.supervisor import Supervisor

ROOT = Path(__file__).resolve().parents[2]


def _settings(tmp_path: Path, **values: object) -> Settings:
    values.setdefault("policy_path", None)  # whatever the environment says
    return Settings(state_dir=tmp_path, **values)  # type: ignore[arg-type]


def test_the_simulator_gets_the_simulated_organisations_policy(tmp_path: Path) -> None:
    settings = with_demo_policy(_settings(tmp_path))
    assert settings.policy_path == SIM_POLICY == ROOT / "deploy" / "policy.sim.yaml"
    sup = Supervisor(settings)
    state = {c.name: sup.component_status(c) for c in sup.components}
    assert state["appeals"].enabled
    # No engine: reservations are recorded and approved by the page, none is put onto a scheduler; status says so.
    assert not state["reservations"].enabled and "sinks.reservations.engines" in state["reservations"].detail
    assert not state["escalations"].enabled and "sinks.escalations.engines" in state["escalations"].detail
    engines = settings.model_copy(deep=True)
    engines.sinks.escalations.engines = ["kueue"]
    assert Supervisor(engines).component_status(by_name()["escalations"]).enabled  # with an engine: `up` runs it
    assert sup._child_env()["GPULEDGER_POLICY_PATH"] == str(SIM_POLICY)  # every component sees the same policy


def test_an_explicit_policy_or_a_real_source_wins(tmp_path: Path) -> None:
    own = tmp_path / "own.yaml"
    assert with_demo_policy(_settings(tmp_path, policy_path=own)).policy_path == own
    real = with_demo_policy(_settings(tmp_path, cluster="prod"))
    assert real.policy_path is None
    st = Supervisor(real).component_status(by_name()["appeals"])
    assert st.state == "disabled" and "no policy_path" in st.detail


def test_without_a_checkout_the_policy_is_written_into_the_state_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(components, "SIM_POLICY", tmp_path / "absent" / "policy.sim.yaml")
    path = demo_policy(_settings(tmp_path))
    assert path == tmp_path / "policy.sim.yaml" and path.read_text() == sim_policy_text()


def test_the_printed_commands_reach_gpuledger_from_the_folder_up_ran_in(tmp_path: Path) -> None:
    venv = tmp_path / "proj" / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text("")
    (venv / "gpuledger").write_text("#!/bin/sh\n")
    (venv / "gpuledger").chmod(0o755)
    exe = str(venv / "python")
    # `make up` in the project folder: the venv is not on PATH, the entry point relative to the folder.
    assert command_prefix(tmp_path / "proj", exe, path="/usr/bin:/bin") == ".venv/bin/gpuledger"
    # A folder above it: relative still; a folder beside it: its absolute path.
    assert command_prefix(tmp_path, exe, path="/usr/bin") == "proj/.venv/bin/gpuledger"
    assert command_prefix(tmp_path / "other", exe, path="/usr/bin") == str(venv / "gpuledger")
    # An activated venv or an installed `gpuledger` on PATH: the bare name.
    assert command_prefix(tmp_path / "proj", exe, path=f"/usr/bin:{venv}") == "gpuledger"
    # No entry point beside the interpreter (python -m gpuledger): the interpreter itself.
    assert command_prefix(tmp_path, "/nowhere/python3") == "/nowhere/python3 -m gpuledger"


def test_next_steps_name_the_policy_and_quote_paths(tmp_path: Path) -> None:
    settings = with_demo_policy(_settings(tmp_path / "a dir"))
    steps = [c for c, _ in next_steps(settings, tmp_path / "a dir", ".venv/bin/gpuledger", "2026-11")]
    assert all(c.startswith((".venv/bin/gpuledger ", "tail -f ")) for c in steps)
    assert f"--quota --policy {SIM_POLICY}" in "\n".join(steps)
    assert all(f"--state-dir '{tmp_path / 'a dir'}'" in c for c in steps if c.startswith(".venv"))
