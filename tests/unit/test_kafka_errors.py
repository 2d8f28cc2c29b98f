"""Which client errors end a consumer: confluent-kafka's own error objects, both spellings of fatal."""

from __future__ import annotations

from confluent_kafka import KafkaError

from base.kafka import is_fatal


def test_fatal_errors_in_both_spellings_and_the_rest_not() -> None:
    assert is_fatal(KafkaError(KafkaError._FATAL, "fenced by another instance"))  # fatal() is False for this one
    assert is_fatal(KafkaError(KafkaError.FENCED_INSTANCE_ID, "fenced", fatal=True))
    assert not is_fatal(KafkaError(KafkaError._PARTITION_EOF, "end of partition"))
    assert not is_fatal(KafkaError(KafkaError._TRANSPORT, "broker down"))
