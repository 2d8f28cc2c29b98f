"""The one consumer loop (`streams.consume.ConsumerLoop`): a bad record and a refused one go to
`<topic>.dlq`, the handler sees only the good ones, every dead letter is delivered before the batch's
offsets are committed, a failed delivery commits nothing, and a fatal client error raises.

The consumer, codec and publisher are stand-ins: what is tested is the loop's order of steps (the
real broker is in tests/integration/test_dlq.py, test_sink_kafka.py and test_chat_webhook.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError

from base.errors import ContractError, ServiceError
from base.settings import KafkaSettings
from schemas.codec import MalformedRecord
from streams.consume import ConsumerLoop, Received, Refused

TOPIC = "alerts.v1"


class Msg:
    def __init__(self, offset: int, value: bytes, partition: int = 0, error: KafkaError | None = None) -> None:
        self._offset, self._value, self._partition, self._error = offset, value, partition, error

    def topic(self) -> str:
        return TOPIC

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return b"k%d" % self._offset

    def value(self) -> bytes:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return (0, 0)

    def error(self) -> KafkaError | None:
        return self._error


class Fake:
    """Consumer, codec and publisher at once, writing what happens to one journal."""

    def __init__(self, batches: list[list[Msg]]) -> None:
        self.batches = batches
        self.journal: list[tuple[Any, ...]] = []
        self.fail_flush = False

    # consumer
    def consume(self, num_messages: int, timeout: float) -> list[Msg]:
        return self.batches.pop(0) if self.batches else []

    def commit(self, offsets: list[Any], asynchronous: bool) -> None:
        assert asynchronous
        self.journal.append(("commit", sorted((tp.partition, tp.offset) for tp in offsets)))

    def assignment(self) -> list[Any]:
        return []

    def close(self) -> None:
        pass

    # codec
    def decode(self, value: bytes, expected_subject: str | None = None) -> Any:
        if value == b"bad":
            raise MalformedRecord("neither framing")
        return SimpleNamespace(subject=expected_subject, record={"v": value.decode()})

    def encode(self, subject: str, record: dict[str, Any]) -> bytes:
        return b"envelope"

    # publisher
    def publish_raw(self, topic: str, key: bytes | None, value: bytes | None, headers: Any = None) -> None:
        self.journal.append(("dead", topic, key, dict(headers or [])["dlq.error.class"].decode()))

    def flush(self, timeout_s: float = 30.0) -> None:
        if self.fail_flush:
            raise ServiceError("1 records not delivered")
        self.journal.append(("flush",))


def _loop(fake: Fake) -> ConsumerLoop:
    loop = ConsumerLoop(
        KafkaSettings(bootstrap_servers="127.0.0.1:1"), "g", [TOPIC], codec=fake, publisher=fake, validate=False  # type: ignore[arg-type]
    )
    loop.consumer.close()
    loop.consumer = fake
    return loop


def test_bad_and_refused_records_are_dead_lettered_and_delivered_before_the_commit() -> None:
    fake = Fake([[Msg(10, b"a"), Msg(11, b"bad"), Msg(12, b"refuse"), Msg(3, b"b", partition=1)]])
    seen: list[str] = []

    def handle(batch: list[Received]) -> list[Refused]:
        seen.extend(r.record["v"] for r in batch)
        return [Refused(r.source, ContractError("no such table")) for r in batch if r.record["v"] == "refuse"]

    loop = _loop(fake)
    assert loop.step(handle) == 4
    assert seen == ["a", "refuse", "b"]
    assert fake.journal == [
        ("dead", TOPIC + ".dlq", b"k11", "MalformedRecord"),
        ("dead", TOPIC + ".dlq", b"k12", "ContractError"),
        ("flush",),
        ("commit", [(0, 13), (1, 4)]),
    ]
    assert (loop.stats.decoded, loop.stats.dead_lettered, loop.stats.batches) == (3, 2, 1)


def test_undelivered_dead_letters_commit_nothing() -> None:
    fake = Fake([[Msg(0, b"bad")]])
    fake.fail_flush = True
    loop = _loop(fake)
    with pytest.raises(ServiceError):
        loop.step(lambda batch: None)
    assert not [e for e in fake.journal if e[0] == "commit"]


def test_a_fatal_client_error_raises_and_a_transient_one_is_skipped() -> None:
    transient = Msg(0, b"", error=KafkaError(KafkaError._TRANSPORT))
    fake = Fake([[transient, Msg(5, b"a")], [Msg(0, b"", error=KafkaError(KafkaError._FATAL))]])
    loop = _loop(fake)
    assert loop.step(lambda batch: None) == 1
    assert fake.journal[-1] == ("commit", [(0, 6)])
    with pytest.raises(ServiceError, match="failed"):
        loop.step(lambda batch: None)
