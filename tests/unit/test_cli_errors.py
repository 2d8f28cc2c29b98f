"""A bad command line gets one line on stderr and exit status 2, never a traceback or a panel."""

import subprocess
import sys

import pytest


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from gpuledger.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("no-such-command",), "No such command"),
        (("sql",), "Missing argument"),
        (("report", "chargeback", "--period", "nope"), "--period must be a month"),
        (("settings", "--state-dir"), "requires an argument"),
    ],
)
def test_bad_arguments_give_one_line(args: tuple[str, ...], expected: str) -> None:
    result = _run(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert expected in lines[0]
    assert "Traceback" not in result.stderr


def test_group_without_subcommand_prints_help() -> None:
    result = _run("report")
    assert result.returncode == 0
    assert "chargeback" in result.stdout
