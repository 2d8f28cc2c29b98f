"""The repeat runner (tests/repeat.py) reads pytest's own junit output: a pass, a failure, a skip and a test
that fails only on some runs, run for real by pytest in a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import repeat

SAMPLE = '''
import os
import pytest

def test_passes():
    assert True

def test_fails():
    assert 1 == 2, "one is not two"

@pytest.mark.skip(reason="not here")  # the sample's own skip: the runner must count a skip as no run
def test_skipped():
    pass

def test_flaky():
    assert os.environ["RUN"] != "2"
'''


def _junit(tmp_path: Path, run: int) -> str:
    (tmp_path / "test_sample.py").write_text(SAMPLE, encoding="utf-8")
    out = tmp_path / f"junit-{run}.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-o",
                    "junit_family=xunit1", "--junitxml", str(out), "test_sample.py"],
                   cwd=tmp_path, env={"RUN": str(run)}, capture_output=True, check=False)  # fmt: skip
    return out.read_text(encoding="utf-8")


def test_pass_rates_and_failures_over_runs(tmp_path: Path) -> None:
    table = repeat.tally([_junit(tmp_path, run) for run in (1, 2, 3)])
    by_name = {k.rsplit("::", 1)[1]: v for k, v in table.items()}
    assert (by_name["test_passes"].passed, by_name["test_passes"].ran) == (3, 3)
    assert (by_name["test_fails"].passed, by_name["test_fails"].failed) == (0, 3)
    assert "one is not two" in by_name["test_fails"].failures[0]
    assert by_name["test_skipped"].ran == 0 and by_name["test_skipped"].skipped == 3
    assert by_name["test_flaky"].pass_rate == pytest.approx(2 / 3)
    text = repeat.render(table, 3)
    lines = text.splitlines()
    assert "test_fails" in lines[1] and "0/3" in lines[1] and "0.0%" in lines[1]  # worst first
    assert "test_flaky" in lines[2] and "66.7%" in lines[2]
    assert lines[-1] == "4 tests over 3 runs; 2 failed at least once"


def test_bad_arguments_get_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        repeat.main(["--set", "live", "--runs", "0"])
    assert exc.value.code == 2 and "--runs must be in 1..100" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        repeat.main([])
    assert "name a --set or test paths" in capsys.readouterr().err
