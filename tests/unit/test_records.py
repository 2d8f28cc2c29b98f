"""The typed records (schemas/records.py) against the `.avsc`: generated from them, drift fails here.

The `.avsc` is the one place a contract's shape is written; `schemas/records.py` is generated from
it. These tests fail when the two differ (a schema edited without `python -m schemas.codegen`), and
show that the check sees every kind of drift on synthetic schemas. Round trips: every sample record
of every subject (each enum symbol and union branch) goes dict -> class -> dict unchanged, and the
codec writes the same bytes for the class as for the dict.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from base.errors import ContractError
from base.settings import KafkaSettings
from schemas import DEFAULT_STORE, SCHEMA_DIR, SchemaStore, load_schema, subjects, topics
from schemas import records as generated
from schemas.codec import AvroCodec
from schemas.codegen import OUTPUT, drift, main, render
from schemas.evolution import sample_records
from schemas.records import RECORDS, JobEvent, NodeScrape
from streams import publish as publish_module
from streams.publish import RecordPublisher


def test_the_checked_in_module_is_what_the_schemas_generate() -> None:
    assert OUTPUT.read_text(encoding="utf-8") == render(DEFAULT_STORE), "run `python -m schemas.codegen`"
    assert main(["--check"]) == 0


def test_every_field_type_default_and_symbol_agrees_with_the_schema() -> None:
    assert drift(generated) == []


def test_one_class_per_subject() -> None:
    assert sorted(RECORDS) == subjects()
    for subject, cls in RECORDS.items():
        assert subject == cls.SUBJECT
        assert cls.__name__ == load_schema(subject)["name"]


# -- drift on synthetic schemas ---------------------------------------------------------------


def _store(tmp_path: Path, subject: str, change: Any) -> SchemaStore:
    """A copy of the package's schemas with `change` applied to `subject`'s latest version."""
    root = tmp_path / "schemas"
    root.mkdir()
    for path in SCHEMA_DIR.glob("*.avsc"):
        shutil.copy(path, root / path.name)
    schema = json.loads((root / f"{subject}.avsc").read_text(encoding="utf-8"))
    change(schema)
    (root / f"{subject}.avsc").write_text(json.dumps(schema), encoding="utf-8")
    return SchemaStore(root)


def test_an_extra_field_in_the_schema_is_drift(tmp_path: Path) -> None:
    def add(s: dict[str, Any]) -> None:
        s["fields"].append({"name": "rack", "type": ["null", "string"], "default": None, "doc": "Rack."})

    store = _store(tmp_path, "telemetry.device-samples", add)
    assert drift(generated, store) == ["record NodeScrape: field 'rack' in the schema, not in the class"]
    assert render(store) != OUTPUT.read_text(encoding="utf-8")
    stale = tmp_path / "records.py"
    stale.write_text(OUTPUT.read_text(encoding="utf-8"), encoding="utf-8")
    assert main(["--check", "--schema-dir", str(store.root), "--output", str(stale)]) == 1


def test_a_removed_field_a_new_type_a_new_default_and_an_enum_symbol_are_drift(tmp_path: Path) -> None:
    def change(s: dict[str, Any]) -> None:
        s["fields"] = [f for f in s["fields"] if f["name"] != "job_name"]
        by_name = {f["name"]: f for f in s["fields"]}
        by_name["gang_size"]["type"] = "long"
        by_name["gang_size"]["default"] = 1
        by_name["exit_code"]["type"] = ["null", "string"]
        by_name["scheduler"]["type"]["symbols"].append("NOMAD")

    problems = drift(generated, _store(tmp_path, "sched.job-events", change))
    assert sorted(problems) == sorted(
        [
            "enum SchedulerKind: symbols ['SLURM', 'KUBERNETES', 'KUEUE', 'VOLCANO', 'SIMULATOR'], "
            "schema ['SLURM', 'KUBERNETES', 'KUEUE', 'VOLCANO', 'SIMULATOR', 'NOMAD']",
            "record JobEvent: field 'job_name' in the class, not in the schema",
            "record JobEvent.gang_size: default 0, schema 1",
            "record JobEvent.exit_code: type int | None, schema str | None",
        ]
    )


def test_fields_in_another_order_are_drift(tmp_path: Path) -> None:
    def swap(s: dict[str, Any]) -> None:
        s["fields"][0], s["fields"][1] = s["fields"][1], s["fields"][0]

    assert drift(generated, _store(tmp_path, "usage.coverage-minutes", swap)) == [
        "record CoverageMinute: fields in another order than the schema's"
    ]


def test_a_type_the_generator_cannot_express_is_refused(tmp_path: Path) -> None:
    def union(s: dict[str, Any]) -> None:
        s["fields"].append({"name": "either", "type": ["int", "string"], "doc": "Either."})

    with pytest.raises(ContractError, match=r"only `null \| X` unions"):
        render(_store(tmp_path, "alerts", union))


# -- round trips and bytes on the wire --------------------------------------------------------


@pytest.mark.parametrize("subject", subjects())
def test_dict_to_class_to_dict_and_the_same_bytes(subject: str) -> None:
    codec = AvroCodec()
    cls = RECORDS[subject]
    for record in sample_records(load_schema(subject)):
        typed = cls.from_avro(record)
        assert typed.to_avro() == record
        assert codec.encode(subject, typed.to_avro()) == codec.encode(subject, record)
        assert cls.from_avro(codec.decode(codec.encode(subject, typed.to_avro())).record) == typed


def test_defaults_come_from_the_schema_and_the_classes_are_frozen() -> None:
    event = JobEvent(
        event_id="e1",
        event_type="STARTED",
        ts_ms=1,
        scheduler="SLURM",
        cluster="c1",
        job_id="1",
        user="u",
        project_source="MISSING",
        project_validation="NOT_CHECKED",
    )
    assert event.pricing_tier == "on-prem" and event.allocations == () and event.identity is None
    assert event.to_avro()["allocations"] == []
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.job_id = "2"  # type: ignore[misc]
    scrape = NodeScrape.from_avro(
        {"cluster": "c", "node": "n", "ts_ms": 1, "source": "s", "mapping_version": "m", "devices": [{"uuid": "GPU-0"}]}
    )
    assert scrape.exporter_version is None and scrape.devices[0].index is None


# -- publishing a typed record ----------------------------------------------------------------


class _Producer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes | None]] = []

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None, **_: Any) -> None:
        self.sent.append((topic, key, value))

    def poll(self, _timeout: float) -> int:
        return 0


def _publisher(monkeypatch: pytest.MonkeyPatch) -> tuple[RecordPublisher, _Producer]:
    producer = _Producer()
    monkeypatch.setattr(publish_module, "new_producer", lambda *_a, **_k: producer)
    return RecordPublisher(KafkaSettings(), AvroCodec()), producer


def test_publish_takes_a_typed_record_and_writes_the_bytes_of_its_dict(monkeypatch: pytest.MonkeyPatch) -> None:
    pub, producer = _publisher(monkeypatch)
    record = sample_records(load_schema("sched.job-events"))[0]
    pub.publish(topics.JOB_EVENTS, b"k", JobEvent.from_avro(record))
    pub.publish(topics.JOB_EVENTS, b"k", record)
    assert (
        producer.sent[0]
        == producer.sent[1]
        == (topics.JOB_EVENTS.name, b"k", AvroCodec().encode(JobEvent.SUBJECT, record))
    )


def test_publish_refuses_a_typed_record_of_another_subject(monkeypatch: pytest.MonkeyPatch) -> None:
    pub, producer = _publisher(monkeypatch)
    scrape = NodeScrape.from_avro(sample_records(load_schema("telemetry.device-samples"))[0])
    with pytest.raises(ContractError, match=r"cannot go to 'sched\.job-events\.v1'"):
        pub.publish(topics.JOB_EVENTS, b"k", scrape)
    assert producer.sent == []
