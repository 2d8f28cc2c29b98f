"""Publish the contracts to a Confluent-compatible schema registry: `gpuledger schemas register`.

Every topic of the catalogue (and its `.dlq`) gets a registry subject named by a strategy, Confluent's
`TopicNameStrategy` (`<topic>-value`) by default (`kafka.schema_registry_subject`). Each subject's
compatibility is set to BACKWARD, then its whole history is registered in order, version 1 first,
so the registry checks every evolution step as it goes and hands out ids in history order.
Re-running is idempotent: a version the subject already holds is looked up, not registered again.

`plan` is pure (the store and the catalogue in, what to register out); `RegistryApi` is the thin HTTP
adapter (the Confluent REST API, as Apicurio's `/apis/ccompat/v7` and Confluent's own serve it);
`register_all` strings them together.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from base.errors import ContractError, ServiceError
from schemas import SchemaStore
from schemas.codec import record_name
from schemas.topics import Topic

COMPATIBILITY = "BACKWARD"
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"

SubjectName = Callable[[str, str], str]  # (topic, record full name) -> registry subject


def schema_text(schema: dict[str, Any]) -> str:
    """The text registered for a schema: the `.avsc` as JSON, exactly as the codec registers it, so a
    registry that keys content by its text gives both the same id."""
    return json.dumps(schema)


@dataclass(frozen=True, slots=True)
class SubjectPlan:
    """One registry subject: the topics it serves and the schema texts to hold, version 1 first."""

    subject: str
    contract: str  # the subject's name under schemas/
    topics: tuple[str, ...]
    versions: tuple[str, ...]


def plan(store: SchemaStore, topics: Iterable[Topic], prefix: str, subject_name: SubjectName) -> list[SubjectPlan]:
    """The registry subjects of `topics` (broker names get `prefix`), each with its contract's history.

    Topics that share a registry subject (a `{record}` strategy) must carry the same contract."""
    by_subject: dict[str, SubjectPlan] = {}
    for topic in topics:
        history = store.versions(topic.subject)
        name = prefix + topic.name
        subject = subject_name(name, record_name(history[-1]))
        known = by_subject.get(subject)
        if known is not None:
            if known.contract != topic.subject:
                raise ContractError(
                    f"registry subject {subject!r} would carry both {known.contract!r} ({known.topics[0]}) and "
                    f"{topic.subject!r} ({name}): choose a subject name strategy with {{topic}} in it"
                )
            by_subject[subject] = SubjectPlan(subject, known.contract, (*known.topics, name), known.versions)
            continue
        by_subject[subject] = SubjectPlan(subject, topic.subject, (name,), tuple(schema_text(v) for v in history))
    return list(by_subject.values())


# ------------------------------------------------------------------------------------------------
# The HTTP adapter


class RegistryRejected(ServiceError):
    """The registry answered with an error: what was asked (subject, version) and what it said."""

    def __init__(self, message: str, *, status: int, error_code: int | None, subject: str | None) -> None:
        super().__init__(message)
        self.status = status
        self.error_code = error_code
        self.subject = subject


class IncompatibleSchema(RegistryRejected):
    """HTTP 409: the schema breaks the subject's compatibility rule."""


@dataclass(frozen=True, slots=True)
class Registered:
    subject: str
    version: int  # the registry's version number
    schema_id: int
    created: bool  # False: the subject held it already


class RegistryApi:
    """The few calls of the Confluent Schema Registry REST API that publishing takes."""

    def __init__(self, url: str, *, timeout_s: float = 10.0, client: httpx.Client | None = None) -> None:
        self.url = url.rstrip("/")
        self._client = client or httpx.Client(timeout=timeout_s, headers={"Content-Type": CONTENT_TYPE})

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> RegistryApi:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, subject: str | None, body: dict[str, Any] | None = None) -> Any:
        try:
            resp = self._client.request(method, self.url + path, json=body)
        except httpx.HTTPError as exc:
            raise ServiceError(f"schema registry {self.url}: {method} {path}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code < 300:
            return resp.json()
        try:
            err = resp.json()
            code, message = err.get("error_code"), str(err.get("message", ""))
        except (ValueError, AttributeError):
            code, message = None, resp.text[:200]
        kind = IncompatibleSchema if resp.status_code == 409 else RegistryRejected
        where = f"subject {subject!r}: " if subject else ""
        raise kind(
            f"schema registry {self.url}: {where}{method} {path}: HTTP {resp.status_code} ({code}): {message[:300]}",
            status=resp.status_code,
            error_code=code if isinstance(code, int) else None,
            subject=subject,
        )

    @staticmethod
    def _subject_path(subject: str) -> str:
        return "/subjects/" + quote(subject, safe="")

    def subjects(self) -> list[str]:
        return [str(s) for s in self._call("GET", "/subjects", None)]

    def set_compatibility(self, subject: str, level: str) -> None:
        self._call("PUT", "/config/" + quote(subject, safe=""), subject, {"compatibility": level})

    def compatibility(self, subject: str) -> str:
        data = self._call("GET", "/config/" + quote(subject, safe=""), subject)
        return str(data.get("compatibilityLevel") or data.get("compatibility"))

    def lookup(self, subject: str, schema: str) -> Registered | None:
        """The version of `subject` that holds exactly `schema`, if any."""
        try:
            data = self._call("POST", self._subject_path(subject), subject, {"schema": schema})
        except RegistryRejected as exc:
            if exc.status == 404:  # 40401 no such subject, 40403 not under it
                return None
            raise
        return Registered(subject, int(data["version"]), int(data["id"]), created=False)

    def register(self, subject: str, schema: str) -> int:
        data = self._call("POST", self._subject_path(subject) + "/versions", subject, {"schema": schema})
        return int(data["id"])

    def versions(self, subject: str) -> list[int]:
        try:
            return [int(v) for v in self._call("GET", self._subject_path(subject) + "/versions", subject)]
        except RegistryRejected as exc:
            if exc.status == 404:
                return []
            raise


def register_subject(api: RegistryApi, item: SubjectPlan, compatibility: str = COMPATIBILITY) -> Iterator[Registered]:
    """Set the subject's compatibility, then hold every version of its history, in order."""
    api.set_compatibility(item.subject, compatibility)
    for number, schema in enumerate(item.versions, start=1):
        found = api.lookup(item.subject, schema)
        if found is None:
            try:
                schema_id = api.register(item.subject, schema)
            except IncompatibleSchema as exc:
                raise IncompatibleSchema(
                    f"{item.subject}: version {number} of {item.contract!r} is refused as incompatible with what "
                    f"the subject holds ({exc})",
                    status=exc.status,
                    error_code=exc.error_code,
                    subject=item.subject,
                ) from exc
            found = api.lookup(item.subject, schema)
            if found is None:  # registered, yet not found: report what the registry said
                raise ServiceError(f"{item.subject}: version {number} was given id {schema_id} but lookup misses it")
            found = Registered(found.subject, found.version, found.schema_id, created=True)
        yield found


def register_all(api: RegistryApi, plans: Iterable[SubjectPlan]) -> list[Registered]:
    return [done for item in plans for done in register_subject(api, item)]
