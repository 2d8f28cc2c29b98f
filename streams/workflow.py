"""What the workflow commands share (appeals, reservations, escalations: `sinks/appeal_cli.py`,
`sinks/reserve_cli.py`, `sinks/escalate_cli.py`): a step is published only once the contract accepts it, keyed so
that one workflow's steps stay in order on one partition; and a workflow's service is one pass every few seconds
until SIGTERM, a pass that fails (the broker away) retried at the next.

Written once here, below the components, so that each command module keeps only its workflow's rules (the pure
`schemas/governance_*.py`) and its engines.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from base.cli_common import stop_signal
from base.errors import ConfigError, ContractError
from base.settings import KafkaSettings
from schemas.topics import Topic

Step = dict[str, Any]


def publish_steps(kafka: KafkaSettings, topic: Topic, events: Sequence[Step],
                  key: Callable[[Mapping[str, Any]], bytes]) -> None:  # fmt: skip
    """Validate every step as each consumer will (a one-line ConfigError, nothing published, when one is not
    valid), then publish them under `key(step)` and wait for delivery."""
    from schemas.models import validate
    from streams.publish import RecordPublisher

    for event in events:
        try:
            validate(topic.subject, event)
        except ContractError as exc:
            raise ConfigError(str(exc).splitlines()[0][:300]) from exc
    if not events:
        return
    pub = RecordPublisher(kafka)
    for event in events:
        pub.publish(topic, key(event), event)
    pub.flush()


def run_passes(name: str, every_s: float, one_pass: Callable[[], Iterable[Step]], describe: Callable[[Step], str],
               log: logging.Logger) -> None:  # fmt: skip
    """A workflow's service: `one_pass()` every `every_s` seconds until SIGTERM, each step it publishes logged as
    `describe(step)`. The topic is read whole each pass (workflows are few), so a restart resumes from it alone."""
    stop = stop_signal(name)
    while not stop():
        try:
            for event in one_pass():
                log.info("%s", describe(event))
        except Exception as exc:  # a pass that fails (broker away) is retried at the next one
            log.warning("%s pass failed: %s", name, exc)
        deadline = time.monotonic() + every_s
        while not stop() and time.monotonic() < deadline:
            time.sleep(0.2)


def chosen_engines(names: Sequence[str] | None, configured: Iterable[str], makers: Mapping[str, Callable[[], Any]],
                   setting: str) -> list[Any]:  # fmt: skip
    """The engines a workflow's service acts on: those named on the command line (`--engine`, repeatable), else
    the settings' (`setting`, named in the error), each made once, in order. A name not in `makers`, or none at
    all, is a one-line ConfigError."""
    names = list(names or configured)
    if not names:
        raise ConfigError(f"no engine: pass --engine {'|'.join(makers)} or set {setting}")
    out: list[Any] = []
    for name in dict.fromkeys(names):
        if name not in makers:
            raise ConfigError(f"--engine must be {' or '.join(makers)}, got {name!r}")
        out.append(makers[name]())
    return out
