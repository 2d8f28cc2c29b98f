"""The `.avsc` files: layout, conventions, evolution, and the models generated from them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import schemas
from base.errors import ContractError
from schemas import SCHEMA_DIR, SchemaStore, load_schema, subjects
from schemas.codec import InvalidRecord, _strip_logical_types
from schemas.evolution import check, check_subject, main, sample_records
from schemas.models import model_for, validate
from schemas.topics import CATALOGUE

# -- layout -----------------------------------------------------------------------------------


def test_every_catalogue_subject_has_a_schema_and_every_schema_is_used():
    assert set(subjects()) == {t.subject for t in CATALOGUE} | {"deadletter"}


def test_load_schema_returns_the_latest_and_versions_are_numbered():
    for subject in subjects():
        latest = schemas.latest_version(subject)
        assert load_schema(subject) == load_schema(subject, latest)
        assert json.loads((SCHEMA_DIR / f"{subject}.avsc").read_text()) == load_schema(subject)
    assert schemas.latest_version("sched.job-events") == 4
    assert "projects" not in json.dumps(load_schema("sched.job-events", 1))
    assert "project_claimed" not in json.dumps(load_schema("sched.job-events", 2))
    assert "user_uid" not in json.dumps(load_schema("sched.job-events", 3))


def test_unknown_subject_or_version():
    with pytest.raises(KeyError, match="no schema"):
        load_schema("nope")
    with pytest.raises(KeyError, match=r"versions 1\.\.4"):
        load_schema("sched.job-events", 7)


def test_history_with_a_gap_is_rejected(tmp_path: Path):
    shutil.copy(SCHEMA_DIR / "alerts.avsc", tmp_path / "alerts.avsc")
    (tmp_path / "history" / "alerts").mkdir(parents=True)
    shutil.copy(SCHEMA_DIR / "alerts.avsc", tmp_path / "history" / "alerts" / "2.avsc")
    with pytest.raises(ContractError, match="without gaps"):
        SchemaStore(tmp_path).versions("alerts")


# -- conventions (STYLE.md) -------------------------------------------------------------------


def _records(node: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if isinstance(node, list):
        for branch in node:
            out += _records(branch)
    elif isinstance(node, dict):
        if node.get("type") == "record":
            out.append(node)
            for field in node["fields"]:
                out += _records(field["type"])
        elif node.get("type") == "array":
            out += _records(node["items"])
    return out


def _is_timestamp(t: Any) -> bool:
    if isinstance(t, list):
        return any(_is_timestamp(b) for b in t)
    return isinstance(t, dict) and t.get("logicalType") == "timestamp-millis"


@pytest.mark.parametrize("subject", subjects())
def test_conventions(subject: str):
    for version in range(1, schemas.latest_version(subject) + 1):
        schema = load_schema(subject, version)
        assert schema.get("namespace") == "io.gpuledger.v1"
        for record in _records(schema):
            assert record.get("doc"), record["name"]
            for field in record["fields"]:
                assert field.get("doc"), f"{record['name']}.{field['name']} has no doc"
                if field["name"].endswith("ts_ms") or field["name"] == "minute_start_ms":
                    assert _is_timestamp(field["type"]), f"{field['name']} is not timestamp-millis"


# -- evolution --------------------------------------------------------------------------------


def test_every_subject_reads_every_older_version():
    assert check() == []
    assert main([]) == 0


def test_samples_cover_every_enum_symbol():
    records = sample_records(load_schema("sched.job-events"))
    assert {r["event_type"] for r in records} == set(
        load_schema("sched.job-events")["fields"][1]["type"]["symbols"]
    )


def _evolve(tmp_path: Path, subject: str, change: Any) -> SchemaStore:
    """A schema dir whose `subject` has the real latest as v1 and `change(copy)` as the latest."""
    (tmp_path / "history" / subject).mkdir(parents=True)
    original = load_schema(subject)
    (tmp_path / "history" / subject / "1.avsc").write_text(json.dumps(original))
    new = json.loads(json.dumps(original))
    change(new)
    (tmp_path / f"{subject}.avsc").write_text(json.dumps(new))
    return SchemaStore(tmp_path)


def test_catches_a_field_added_without_default(tmp_path: Path):
    store = _evolve(
        tmp_path, "alerts", lambda s: s["fields"].append({"name": "severity", "type": "string", "doc": "x"})
    )
    problems = check(store)
    assert len(problems) == 1
    assert problems[0].subject == "alerts" and (problems[0].writer_version, problems[0].reader_version) == (1, 2)
    assert "severity" in problems[0].reason
    assert main(["--schema-dir", str(tmp_path)]) == 1


def test_catches_a_removed_enum_symbol(tmp_path: Path):
    def drop_symbol(s: dict[str, Any]) -> None:
        s["fields"][1]["type"]["symbols"].remove("UNKNOWN_DEVICE")

    assert check_subject(_evolve(tmp_path, "alerts", drop_symbol), "alerts")


def test_catches_a_type_change_and_a_rename(tmp_path: Path):
    def retype(s: dict[str, Any]) -> None:
        s["fields"][0]["type"] = "int"

    assert check_subject(_evolve(tmp_path / "a", "alerts", retype), "alerts")

    def rename(s: dict[str, Any]) -> None:
        s["name"] = "Notice"

    assert check_subject(_evolve(tmp_path / "b", "alerts", rename), "alerts")


def test_accepts_a_field_added_with_default(tmp_path: Path):
    store = _evolve(
        tmp_path,
        "alerts",
        lambda s: s["fields"].append({"name": "severity", "type": ["null", "string"], "default": None, "doc": "x"}),
    )
    assert check(store) == []


def test_catches_an_unchanged_copy(tmp_path: Path):
    store = _evolve(tmp_path, "alerts", lambda s: None)
    assert [p.reason for p in check(store)] == ["identical to an older version"]


# -- models agree with the schemas ------------------------------------------------------------


def _model_shape(model: Any) -> dict[str, Any]:
    return {
        name: (field.is_required(), None if field.is_required() else field.default)
        for name, field in model.model_fields.items()
    }


def _schema_shape(record: dict[str, Any]) -> dict[str, Any]:
    return {f["name"]: ("default" not in f, f.get("default")) for f in record["fields"]}


@pytest.mark.parametrize("subject", subjects())
def test_model_fields_equal_the_avsc_fields(subject: str):
    model = model_for(subject)
    schema = _strip_logical_types(load_schema(subject))
    assert _model_shape(model) == _schema_shape(schema)
    # Nested records: every named record in the schema has a model with the same fields.
    nested = {m.__name__: m for m in _nested_models(model)}
    for record in _records(schema):
        assert _model_shape(nested[record["name"]]) == _schema_shape(record)


def _nested_models(model: Any) -> list[Any]:
    from pydantic import BaseModel

    found = [model]
    for field in model.model_fields.values():
        stack = [field.annotation]
        while stack:
            t = stack.pop()
            if isinstance(t, type) and issubclass(t, BaseModel):
                found += _nested_models(t)
            stack += list(getattr(t, "__args__", ()))
    return found


@pytest.mark.parametrize("subject", subjects())
def test_models_accept_every_shape_the_schema_allows(subject: str):
    """Generated records cover every union branch and enum symbol: only value rules may reject them."""
    from pydantic import ValidationError

    value_rules = {"less_than_equal", "greater_than_equal", "string_too_short", "value_error"}
    for record in sample_records(load_schema(subject)):
        try:
            model_for(subject).model_validate(record)
        except ValidationError as exc:
            assert {e["type"] for e in exc.errors()} <= value_rules, exc


def _device_minute(**change: Any) -> dict[str, Any]:
    record = {
        "cluster": "c1",
        "node": "n1",
        "device_uuid": "GPU-1",
        "minute_start_ms": 60_000,
        "generation": "hopper",
        "job_id": "42",
        "allocated_s": 60,
        "active_s": 30,
        "starved_s": 10,
        "idle_s": 15,
        "dark_s": 5,
        "sm_weighted_s": 20.5,
        "sample_count": 55,
        "mapping_version": "m1",
        "classifier_version": "c1",
    }
    return {**record, **change}


def test_validate_accepts_a_good_record_and_reports_every_broken_rule():
    validate("usage.device-minutes", _device_minute())
    with pytest.raises(InvalidRecord, match="allocated_s 61"):
        validate("usage.device-minutes", _device_minute(allocated_s=61))
    with pytest.raises(InvalidRecord, match="activity_mean_ratio"):
        validate("usage.device-minutes", _device_minute(activity_mean_ratio=1.5))
    with pytest.raises(InvalidRecord, match="cluster"):
        validate("usage.device-minutes", _device_minute(cluster=""))
    with pytest.raises(InvalidRecord, match="surprise: Extra inputs"):
        validate("usage.device-minutes", _device_minute(surprise=1))
    with pytest.raises(InvalidRecord, match="at most 60"):
        validate(
            "usage.device-minutes",
            _device_minute(allocated_s=70, active_s=70, starved_s=0, idle_s=0, dark_s=0),
        )
