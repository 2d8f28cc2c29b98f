"""Pydantic models generated from the `.avsc` files (the schema is the one source of truth).

Each subject's latest schema becomes a frozen, strict model with `extra="forbid"`: field names,
types, optionality and defaults come from the schema. On top of the types, the units in field names
(STYLE.md) give value rules, and a few subjects carry cross-field invariants:

- `*_ratio` in [0, 1]; `*_pct` in [0, 100];
- `*_ms`, `*_s`, `*_mib`, `*_w`, `*_bytes_per_s`, `*_minutes`, `*_devices`, `*_count`, `*_size`,
  `index` are >= 0;
- identifiers (`cluster`, `node`, `job_id`, `uuid`, `device_uuid`, `*_id` strings) are not empty;
- usage rows: `allocated_s == active_s + starved_s + idle_s + dark_s`, `sm_weighted_s <= allocated_s`,
  a device-minute holds at most 60 s; coverage: reporting never exceeds expected;
- governance events (appeals, reservations; typed by people): strings at most 256 characters (`text` 2000),
  arrays at most 256 items; a decision where a step needs one, a credit above zero, 1..1e6 GPUs, an end
  after the start.

`validate(subject, record)` is what consumers call on a decoded record: it raises `InvalidRecord`
(a `ContractError`) with every broken rule, which sends the record to the dead-letter topic.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from schemas import DEFAULT_STORE, SchemaStore
from schemas.codec import InvalidRecord, _strip_logical_types

_CONFIG = ConfigDict(strict=True, extra="forbid", frozen=True)

_NON_NEGATIVE_SUFFIXES = ("_ms", "_s", "_mib", "_w", "_bytes_per_s", "_minutes", "_devices", "_count", "_size")
_IDENTIFIERS = {"cluster", "node", "job_id", "uuid", "device_uuid", "event_id", "alert_id", "action_id"}
_IDENTIFIER_SUFFIX = "_id"
_PRIMITIVE_TYPES: dict[str, Any] = {
    "null": type(None),
    "boolean": bool,
    "int": int,
    "long": int,
    "float": float,
    "double": float,
    "bytes": bytes,
    "string": str,
}


def _constrain(field_name: str, base: Any) -> Any:
    """The base type with the value rule the field's name implies, if any."""
    if base in (int, float):
        if field_name.endswith("_ratio"):
            return Annotated[base, Field(ge=0, le=1)]
        if field_name.endswith("_pct"):
            return Annotated[base, Field(ge=0, le=100)]
        if field_name == "index" or field_name.endswith(_NON_NEGATIVE_SUFFIXES):
            return Annotated[base, Field(ge=0)]
    if base is str and (field_name in _IDENTIFIERS or field_name.endswith(_IDENTIFIER_SUFFIX)):
        return Annotated[str, Field(min_length=1)]
    return base


class _Builder:
    """Turns one schema into models, one per named record (nested records become nested models)."""

    def __init__(self) -> None:
        self.named: dict[str, Any] = {}

    def type_of(self, node: Any, field_name: str, namespace: str | None) -> Any:
        if isinstance(node, str):
            if node in _PRIMITIVE_TYPES:
                return _constrain(field_name, _PRIMITIVE_TYPES[node])
            full = node if "." in node or namespace is None else f"{namespace}.{node}"
            return self.named.get(full, self.named.get(node))
        if isinstance(node, list):
            branches = tuple(self.type_of(b, field_name, namespace) for b in node)
            return Union[branches]  # noqa: UP007 (the branches are only known at run time)
        kind = node["type"]
        if kind == "record":
            return self.record(node, namespace)
        if kind == "enum":
            enum_type: Any = Literal[tuple(node["symbols"])]
            ns = node.get("namespace", namespace)
            self.named[f"{ns}.{node['name']}" if ns else node["name"]] = enum_type
            return enum_type
        if kind == "array":
            return list[self.type_of(node["items"], field_name, namespace)]  # type: ignore[misc]
        if kind == "map":
            return dict[str, self.type_of(node["values"], field_name, namespace)]  # type: ignore[misc]
        if kind == "fixed":
            return bytes
        return self.type_of(kind, field_name, namespace)

    def record(self, node: dict[str, Any], namespace: str | None) -> type[BaseModel]:
        ns = node.get("namespace", namespace)
        fields: dict[str, Any] = {}
        for field in node["fields"]:
            annotation = self.type_of(field["type"], field["name"], ns)
            info = Field(description=field.get("doc"))
            if "default" in field:
                info = Field(default=field["default"], description=field.get("doc"))
            fields[field["name"]] = (annotation, info)
        validators = _RULES.get(node["name"], {})
        model: type[BaseModel] = create_model(
            node["name"], __config__=_CONFIG, __doc__=node.get("doc"), __validators__=validators, **fields
        )
        self.named[f"{ns}.{node['name']}" if ns else node["name"]] = model
        return model


# -- cross-field invariants, by record name ---------------------------------------------------


def _usage_seconds(limit_per_device: bool) -> Callable[[Any], Any]:
    def check(self: Any) -> Any:
        parts = self.active_s + self.starved_s + self.idle_s + self.dark_s
        if self.allocated_s != parts:
            raise ValueError(
                f"allocated_s {self.allocated_s} != active_s + starved_s + idle_s + dark_s = {parts}"
            )
        if self.sm_weighted_s > self.allocated_s + 1e-6:
            raise ValueError(f"sm_weighted_s {self.sm_weighted_s} exceeds allocated_s {self.allocated_s}")
        if limit_per_device and self.allocated_s + self.unallocated_s > 60:
            raise ValueError(f"a device-minute holds at most 60 s, got {self.allocated_s + self.unallocated_s}")
        return self

    return check


def _coverage(self: Any) -> Any:
    if self.reporting_devices > self.expected_devices and self.unexpected_devices == 0:
        raise ValueError(f"reporting_devices {self.reporting_devices} > expected_devices {self.expected_devices}")
    if self.reporting_device_s > self.expected_device_s:
        raise ValueError(f"reporting_device_s {self.reporting_device_s} > expected_device_s {self.expected_device_s}")
    return self


_MAX_TEXT, _MAX_NAME, _MAX_ITEMS = 2000, 256, 256  # governance events are typed by people: bounded


def _bounded(self: Any) -> Any:
    for name, value in self.__dict__.items():
        limit = _MAX_TEXT if name == "text" else _MAX_NAME
        if isinstance(value, str) and len(value) > limit:
            raise ValueError(f"{name} is {len(value)} characters, at most {limit}")
        if isinstance(value, list | tuple) and len(value) > _MAX_ITEMS:
            raise ValueError(f"{name} has {len(value)} items, at most {_MAX_ITEMS}")
    return self


def _appeal(self: Any) -> Any:
    _bounded(self)
    if self.event_type == "DECIDED" and self.decision is None:
        raise ValueError("a DECIDED step carries its decision")
    if self.decision == "CREDIT" and (self.credit_cents is None or self.credit_cents <= 0):
        raise ValueError("a CREDIT decision carries a positive credit_cents")
    return self


def _reservation(self: Any) -> Any:
    _bounded(self)
    if not 0 < self.gpus <= 1_000_000:
        raise ValueError(f"gpus must be 1..1000000, got {self.gpus}")
    if self.end_ms <= self.start_ms and self.event_type in ("REQUESTED", "APPROVED", "EXTENDED"):
        raise ValueError("end_ms must be after start_ms")
    return self


_RULES: dict[str, dict[str, Any]] = {
    "AppealEvent": {"_appeal_rules": model_validator(mode="after")(_appeal)},
    "ReservationEvent": {"_reservation_rules": model_validator(mode="after")(_reservation)},
    "DeviceMinute": {"_seconds_add_up": model_validator(mode="after")(_usage_seconds(limit_per_device=True))},
    "JobMinute": {"_seconds_add_up": model_validator(mode="after")(_usage_seconds(limit_per_device=False))},
    "CoverageMinute": {"_within_expected": model_validator(mode="after")(_coverage)},
}


@cache
def _models(store: SchemaStore) -> dict[str, type[BaseModel]]:
    out: dict[str, type[BaseModel]] = {}
    for subject in store.subjects():
        out[subject] = _Builder().record(_strip_logical_types(store.load(subject)), None)
    return out


def model_for(subject: str, store: SchemaStore = DEFAULT_STORE) -> type[BaseModel]:
    """The model of `subject`'s latest schema."""
    try:
        return _models(store)[subject]
    except KeyError:
        raise KeyError(f"no schema for subject {subject!r}") from None


def validate(subject: str, record: dict[str, Any]) -> None:
    """Raise `InvalidRecord` listing every rule `record` (a decoded dict) breaks."""
    try:
        model_for(subject).model_validate(record)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<record>'}: {err['msg']}" for err in exc.errors()
        )
        raise InvalidRecord(f"invalid {subject!r} record: {problems}") from exc
