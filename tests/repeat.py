"""Run a set of tests N times, each run on a clean state, and print each test's pass rate and slowest run.

    .venv/bin/python tests/repeat.py --set live --runs 10
    .venv/bin/python tests/repeat.py --set faust --runs 10 -- -k reservation
    .venv/bin/python tests/repeat.py tests/integration/test_broker_faust.py --runs 5
    make repeat SET=fault RUNS=3

A test that fails by chance is a defect: this is how one is found before it is called fixed, and how a fix
is shown (every test at 100%). Each run is its own pytest process with its own `--basetemp` and state
directory, so no run inherits a broker, a control plane or a file from the one before. The table is sorted
worst pass rate first; `--json FILE` also writes it as data. Exit status 1 when any test failed in any run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SETS: dict[str, tuple[str, ...]] = {
    # the live engines: the local Kubernetes control plane with Kueue, and the live Slurm
    "live": ("-m", "live_engine", "tests/integration"),
    # the faust agents and the processes around them on a real broker
    "faust": (
        "tests/integration/test_agents_fetch_wait.py",
        "tests/integration/test_broker_faust.py",
        "tests/integration/test_idle_appeals.py",
        "tests/integration/test_idle_faust.py",
        "tests/integration/test_processor_harness.py",
        "tests/integration/test_shutdown_bounded.py",
        "tests/integration/test_chat_webhook.py",
    ),
    "fault": ("-m", "fault", "tests/fault"),
}


@dataclass
class Tally:
    """One test's outcomes over the runs."""

    passed: int = 0
    failed: int = 0
    skipped: int = 0
    slowest_s: float = 0.0
    failures: list[str] = field(default_factory=list)

    @property
    def ran(self) -> int:
        return self.passed + self.failed

    @property
    def pass_rate(self) -> float:
        return self.passed / self.ran if self.ran else 0.0


def junit_cases(xml_text: str) -> Iterable[tuple[str, str, float, str]]:
    """(test id, outcome, seconds, first line of the failure) per test case of a pytest junit file."""
    root = ET.fromstring(xml_text)
    for case in root.iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        test_id = f"{classname.replace('.', '/')}.py::{name}" if classname else name
        seconds = float(case.get("time") or 0.0)
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, message = "failed", (child.get("message") or child.text or "").strip().splitlines()[:1]
                message = message[0][:160] if message else ""
                break
            if child.tag == "skipped":
                outcome = "skipped"
        yield test_id, outcome, seconds, message


def tally(runs: Sequence[str], into: dict[str, Tally] | None = None) -> dict[str, Tally]:
    """Adds each run's junit file (text) into one table keyed by test id."""
    table = into if into is not None else {}
    for xml_text in runs:
        for test_id, outcome, seconds, message in junit_cases(xml_text):
            t = table.setdefault(test_id, Tally())
            if outcome == "passed":
                t.passed += 1
            elif outcome == "failed":
                t.failed += 1
                t.failures.append(message)
            else:
                t.skipped += 1
            t.slowest_s = max(t.slowest_s, seconds)
    return table


def render(table: dict[str, Tally], runs: int) -> str:
    # worst pass rate first; tests that never ran (skipped every time) last
    rows = sorted(table.items(), key=lambda kv: (kv[1].pass_rate if kv[1].ran else 2.0, -kv[1].slowest_s, kv[0]))
    width = max([len("test"), *(len(k) for k in table)])
    lines = [f"{'test':<{width}}  {'passed':>9}  {'rate':>6}  {'slowest':>8}  first failure"]
    for test_id, t in rows:
        rate = f"{100 * t.pass_rate:5.1f}%" if t.ran else "  n/a"
        first = t.failures[0] if t.failures else ""
        lines.append(f"{test_id:<{width}}  {t.passed:>4}/{t.ran:<4}  {rate:>6}  {t.slowest_s:7.1f}s  {first}")
    flaky = sum(1 for t in table.values() if t.failed)
    lines.append(f"{len(table)} tests over {runs} runs; {flaky} failed at least once")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", help="test files or node ids (instead of --set)")
    parser.add_argument("--set", choices=sorted(SETS), help="a named set of tests")
    parser.add_argument("--runs", type=int, default=10, help="how many runs (1-100)")
    parser.add_argument("--json", type=Path, help="also write the table as JSON here")
    args, extra = parser.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    if not 1 <= args.runs <= 100:
        parser.error("--runs must be in 1..100")
    if bool(args.set) == bool(args.paths):
        parser.error("name a --set or test paths, not both and not neither")
    selection = list(SETS[args.set]) if args.set else list(args.paths)
    table: dict[str, Tally] = {}
    started = time.monotonic()
    for run in range(1, args.runs + 1):
        with tempfile.TemporaryDirectory(prefix=f"repeat-{run}-") as tmp:
            junit = Path(tmp) / "junit.xml"
            env = {**os.environ, "GPULEDGER_STATE_DIR": str(Path(tmp) / "state")}
            cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", str(Path(tmp) / "t"),
                   "--junitxml", str(junit), "-o", "junit_family=xunit1", *selection, *extra]  # fmt: skip
            t0 = time.monotonic()
            done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
            if not junit.exists():
                tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
                said = " | ".join(tail)
                print(f"run {run}: pytest wrote no results (exit {done.returncode}): {said}", file=sys.stderr)
                return 2
            before = sum(t.failed for t in table.values())
            tally([junit.read_text(encoding="utf-8")], table)
            failed_now = sum(t.failed for t in table.values()) - before
            print(f"run {run}/{args.runs}: exit {done.returncode}, {failed_now} failed, "
                  f"{time.monotonic() - t0:.0f} s (total {time.monotonic() - started:.0f} s)", flush=True)  # fmt: skip
    print(render(table, args.runs))
    if args.json:
        args.json.write_text(json.dumps({k: vars(v) for k, v in table.items()}, indent=2), encoding="utf-8")
    return 1 if any(t.failed for t in table.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
