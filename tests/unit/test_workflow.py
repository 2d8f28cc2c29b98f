"""streams.workflow: what the appeals, reservations and escalations commands share (no broker: publishing is
stubbed at the publisher; the service loop stops on its stop signal)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from base.errors import ConfigError
from base.settings import KafkaSettings
from schemas.topics import RESERVATIONS
from streams import workflow


class _Publisher:
    published: list[tuple[str, bytes, dict[str, Any]]] = []
    flushed = 0

    def __init__(self, kafka: KafkaSettings) -> None:
        del kafka

    def publish(self, topic: Any, key: bytes, event: dict[str, Any]) -> None:
        self.published.append((topic.name, key, event))

    def flush(self) -> None:
        _Publisher.flushed += 1


def test_a_step_the_contract_refuses_stops_the_batch_before_anything_is_published(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import streams.publish

    monkeypatch.setattr(streams.publish, "RecordPublisher", _Publisher)
    _Publisher.published, _Publisher.flushed = [], 0
    with pytest.raises(ConfigError) as err:
        workflow.publish_steps(KafkaSettings(), RESERVATIONS, [{"reservation_id": "r1"}], lambda e: b"k")
    assert "\n" not in str(err.value) and len(str(err.value)) <= 300
    assert _Publisher.published == [] and _Publisher.flushed == 0
    workflow.publish_steps(KafkaSettings(), RESERVATIONS, [], lambda e: b"k")  # nothing to publish: no publisher
    assert _Publisher.flushed == 0


def test_the_engines_come_from_the_command_line_else_the_settings_each_once() -> None:
    makers = {"slurm": lambda: "S", "kueue": lambda: "K"}
    assert workflow.chosen_engines(["kueue", "slurm", "kueue"], ["slurm"], makers, "x.engines") == ["K", "S"]
    assert workflow.chosen_engines(None, ["slurm"], makers, "x.engines") == ["S"]
    with pytest.raises(ConfigError, match=r"^no engine: pass --engine slurm\|kueue or set x.engines$"):
        workflow.chosen_engines(None, [], makers, "x.engines")
    with pytest.raises(ConfigError, match=r"^--engine must be slurm or kueue, got 'pbs'$"):
        workflow.chosen_engines(["pbs"], [], makers, "x.engines")


def test_the_service_runs_a_pass_logs_its_steps_and_survives_a_failed_pass(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    passes: list[int] = []

    def one_pass() -> list[dict[str, Any]]:
        passes.append(len(passes))
        if len(passes) == 1:
            raise RuntimeError("broker away")
        return [{"id": "r1"}]

    monkeypatch.setattr(workflow, "stop_signal", lambda name: lambda: len(passes) >= 2)
    with caplog.at_level(logging.INFO, logger="test.workflow"):
        workflow.run_passes("things", 0.0, one_pass, lambda e: f"step {e['id']}", logging.getLogger("test.workflow"))
    assert passes == [0, 1]
    assert [r.getMessage() for r in caplog.records] == ["things pass failed: broker away", "step r1"]
