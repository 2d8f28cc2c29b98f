"""Identifier and argument checks match the whole text: a trailing newline (which `$` accepts) or any
other extra character is refused before the value reaches SQL, a scheduler command or a policy."""

from __future__ import annotations

import pytest

from base.errors import ConfigError, ParseError
from producers.projects import registry_from_data
from sinks.chargeback import check_period
from sinks.db import check_identifier
from sinks.reclaim import plan


@pytest.mark.parametrize("suffix", ["\n", "\r\n", " ", "\n; DROP TABLE x"])
def test_a_trailing_newline_or_more_is_refused(suffix: str) -> None:
    assert check_identifier("gpuledger") == "gpuledger"
    with pytest.raises(ConfigError):
        check_identifier("gpuledger" + suffix)
    assert check_period("2026-11") == "2026-11"
    with pytest.raises(ConfigError):
        check_period("2026-11" + suffix)
    assert list(registry_from_data({"projects": [{"id": "atlas"}]}).projects) == ["atlas"]
    with pytest.raises(ParseError):
        registry_from_data({"projects": [{"id": "atlas" + suffix}]})


@pytest.mark.parametrize(
    ("job_id", "scheduler", "signal"),
    [("42\n", "SLURM", "USR1"), ("42", "SLURM", "USR1\n"), ("team-a/train\n", "KUEUE", "USR1"),
     ("team-a\n/train", "KUEUE", "USR1")],
)  # fmt: skip
def test_reclaim_refuses_ids_with_a_trailing_newline(job_id: str, scheduler: str, signal: str) -> None:
    action = {"scheduler": scheduler, "job_id": job_id, "action": "CANCEL"}
    with pytest.raises(ConfigError):
        plan(action, signal=signal)
    assert plan({**action, "job_id": job_id.replace("\n", "")}, signal=signal.strip())
