"""A running `gpuledger policy watch` and the alerts it publishes (helpers, no fixtures): the live policy tests
(test_slurm_live_policy.py, test_kube_live_policy.py) start one beside their hand edit, so the watch is proven on
the engines the diff is. Each watch gets its own topic prefix on the session's broker; `env` is its environment, for a
`policy apply` whose record (policy.applied.v1) the test reads back with `applies()`."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic
from fixtures_cli import GPULEDGER

from base.settings import KafkaSettings
from schemas.topics import ALERTS, POLICY_APPLIED, RESERVATIONS
from streams.eventlog import read_events

INTERVAL_S = 2.0


class Watch:
    def __init__(self, bootstrap: str, state_dir: Path, args: list[str], env: dict[str, str] | None = None) -> None:
        prefix = f"pw{uuid.uuid4().hex[:8]}."
        admin = AdminClient({"bootstrap.servers": bootstrap})
        names = [prefix + t.name + suffix for t in (ALERTS, RESERVATIONS, POLICY_APPLIED) for suffix in ("", ".dlq")]
        for fut in admin.create_topics([NewTopic(n, 1, 1) for n in names]).values():
            fut.result(timeout=30)
        self.kafka = KafkaSettings(bootstrap_servers=bootstrap, topic_prefix=prefix)
        self.log = state_dir / "watch.log"
        self.env = full_env = {**(env or os.environ), "GPULEDGER_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
                    "GPULEDGER_KAFKA__TOPIC_PREFIX": prefix, "GPULEDGER_STATE_DIR": str(state_dir),
                    "GPULEDGER_CLUSTER": "live", "GPULEDGER_METRICS__ENABLED": "false"}  # fmt: skip
        with self.log.open("w") as out:
            self.proc = subprocess.Popen([*GPULEDGER, "policy", "watch", "--interval-s", str(INTERVAL_S), *args],
                                         env=full_env, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip

    def alerts(self) -> list[dict[str, Any]]:
        return read_events(self.kafka, ALERTS, timeout_s=10)[0]

    def applies(self) -> list[dict[str, Any]]:
        """The `policy apply` records (policy.applied.v1) of commands run with `self.env`."""
        return read_events(self.kafka, POLICY_APPLIED, timeout_s=10)[0]

    def wait(self, what: str, done: Callable[[list[dict[str, Any]]], bool], timeout_s: float = 60) -> float:
        """Seconds until the published alerts satisfy `done`."""
        started = time.monotonic()
        while True:
            alerts = self.alerts()
            if done(alerts):
                return time.monotonic() - started
            assert self.proc.poll() is None, f"policy watch exited: {self.log.read_text()[-3000:]}"
            assert time.monotonic() - started < timeout_s, (
                f"{what}: not within {timeout_s} s; alerts {[(a['kind'], a['drift_lines']) for a in alerts]}; "
                f"log: {self.log.read_text()[-3000:]}")  # fmt: skip
            time.sleep(0.3)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def kinds(alerts: list[dict[str, Any]]) -> list[str]:
    return [a["kind"] for a in alerts]
