"""The supervisor with small real processes as components (no broker needed)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from base.errors import ConfigError, ServiceError
from base.settings import Settings
from stack.broker import pid_alive
from stack.components import Component, Health
from stack.supervisor import Supervisor


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


SLEEPER = Component(
    name="sleeper",
    description="sleeps, with a child of its own",
    # The grandchild checks that `down` stops the whole process group.
    argv=lambda s, _: _py(
        "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
        " time.sleep(600)"
    ),
)
ONESHOT = Component(name="once", description="runs and exits", argv=lambda s, _: _py("print('done')"), oneshot=True)
DISABLED = Component(name="off", description="never wanted", argv=lambda s, _: _py(""), enabled=lambda s: False)
MISSING = Component(name="later", description="lands later", argv=lambda s, _: _py(""), command=("nope", "run"))


def _sup(tmp_path, *components: Component) -> Supervisor:
    return Supervisor(
        Settings(state_dir=tmp_path),
        list(components),
        command_exists=lambda path: path != ("nope", "run"),
    )


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        out.extend(int(t) for t in text)
    return out


def test_up_twice_status_down(tmp_path):
    sup = _sup(tmp_path, SLEEPER, ONESHOT, DISABLED, MISSING)
    first = {s.name: s for s in sup.up()}
    assert first["sleeper"].state == "running" and first["sleeper"].pid
    assert first["once"].state == "done"
    assert first["off"].state == "disabled"
    assert first["later"].state == "unavailable" and "gpuledger nope run" in first["later"].detail
    pid = first["sleeper"].pid
    time.sleep(0.5)
    grandchildren = _children(pid)
    assert grandchildren

    again = {s.name: s for s in sup.up()}
    assert again["sleeper"].pid == pid

    st = sup.status(probe=False)
    states = {c.name: c.state for c in st.components}
    assert states == {"sleeper": "running", "once": "done", "off": "disabled", "later": "unavailable"}
    assert not st.healthy  # `later` is not there yet: said, not hidden
    assert (tmp_path / "logs" / "once.log").read_text().strip().endswith("done")

    assert sup.down() == ["sleeper"]
    assert not pid_alive(pid)
    assert not any(pid_alive(p) for p in grandchildren)
    assert {c.name: c.state for c in sup.status(probe=False).components}["sleeper"] == "stopped"
    assert sup.down() == []


def test_stale_pid_file_is_not_running(tmp_path):
    sup = _sup(tmp_path, SLEEPER)
    sup._write("sleeper", {"pid": 999_999_999 % 4_000_000, "start_ticks": "1"})
    assert sup.running_pid("sleeper") is None
    (st,) = sup.status(probe=False).components
    assert st.state == "failed"
    sup.down()
    assert not sup.pid_file("sleeper").exists()


def test_component_that_dies_while_starting_is_a_one_line_error(tmp_path):
    crash = Component(
        name="crash",
        description="exits at once",
        argv=lambda s, _: _py("import sys; sys.exit(3)"),
        ready=lambda s: Health(False, "never"),
        ready_timeout_s=10,
    )
    sup = _sup(tmp_path, crash, SLEEPER)
    with pytest.raises(ServiceError, match=r"crash: exited with code 3 while starting; see .*crash.log") as info:
        sup.up()
    assert "\n" not in str(info.value)
    # Nothing after it was started.
    assert sup.running_pid("sleeper") is None


def test_unknown_component_name(tmp_path):
    with pytest.raises(ConfigError, match="no component named bogus"):
        _sup(tmp_path, SLEEPER).up({"bogus"})


def _waits_for_partner(name: str, partner: str, where: Path) -> Component:
    """On SIGTERM: says so in a file, waits up to 10 s for `partner`'s, and records whether it came."""
    code = (
        "import os, signal, sys, time\n"
        f"d = {str(where)!r}\n"
        "def stop(*_):\n"
        f"    open(os.path.join(d, 'term-{name}'), 'w').close()\n"
        "    end = time.monotonic() + 10\n"
        f"    while time.monotonic() < end and not os.path.exists(os.path.join(d, 'term-{partner}')):\n"
        "        time.sleep(0.05)\n"
        f"    seen = os.path.exists(os.path.join(d, 'term-{partner}'))\n"
        f"    open(os.path.join(d, 'result-{name}'), 'w').write('together' if seen else 'alone')\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "time.sleep(600)\n"
    )
    return Component(name=name, description="a KRaft-like node", argv=lambda s, _: _py(code), stop_group="pair")


def test_down_stops_a_stop_group_at_once(tmp_path):
    """Nodes of one stop group (the KRaft nodes) get SIGTERM together: each one, stopping, sees the other stop
    too; one after the other, the first would wait for its partner in vain."""
    where = tmp_path / "signals"
    where.mkdir()
    sup = _sup(tmp_path, _waits_for_partner("node-a", "node-b", where), _waits_for_partner("node-b", "node-a", where))
    assert all(s.state == "running" for s in sup.up())
    time.sleep(0.5)  # both installed their handlers
    assert sorted(sup.down()) == ["node-a", "node-b"]
    assert (where / "result-node-a").read_text() == "together"
    assert (where / "result-node-b").read_text() == "together"
