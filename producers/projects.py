"""Project registry and attribution: which project a job is charged to, and how sure we are.

The registry is data (YAML or CSV): projects with cost centres and members, and per-user defaults.
Attribution is pure: `Attributor.resolve(user, explicit)` -> `Attribution`.

Modes:
- grace: a job without a (valid) project is recorded with the user's default, `source=DEFAULT`;
- strict: no fallback. The scheduler's own hooks reject such jobs at submission (see `policy`);
  one that got through anyway is recorded as given (`MISSING` or `UNKNOWN_PROJECT`), never guessed.

Attribution cannot be claimed (both modes): an explicit project the user is not a member of is never
charged. It is kept as `claimed` (the job event's `project_claimed`, for audit and the reports' flag)
and the job is charged to the user's default project (`source=DEFAULT`), or to none when the user has
no default (`source=MISSING`, `validation=NOT_A_MEMBER`). Only the charged project counts anywhere
else (reclaim exemptions, idle thresholds, rollups).
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from base.errors import ConfigError, ParseError

Mode = Literal["grace", "strict"]
# Matched whole (`fullmatch`): `$` would also accept a trailing newline.
PROJECT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


@dataclass(frozen=True, slots=True)
class Project:
    id: str
    cost_centre: str | None = None
    description: str | None = None
    members: frozenset[str] = frozenset()  # users; empty with no teams = open to everyone
    teams: frozenset[str] = frozenset()
    active: bool = True

    def admits(self, user: str, teams: frozenset[str] = frozenset()) -> bool:
        if not self.members and not self.teams:
            return True
        return user in self.members or bool(self.teams & teams)


@dataclass(frozen=True, slots=True)
class Registry:
    projects: Mapping[str, Project]
    user_defaults: Mapping[str, str] = field(default_factory=dict)

    def get(self, project_id: str) -> Project | None:
        p = self.projects.get(project_id)
        return p if p is not None and p.active else None

    def default_for(self, user: str) -> str | None:
        return self.user_defaults.get(user)

    def projects_of(self, user: str, teams: frozenset[str] = frozenset()) -> list[str]:
        """Active projects that name the user (or one of their teams) as a member; open projects excluded."""
        return sorted(
            p.id for p in self.projects.values() if p.active and (p.members or p.teams) and p.admits(user, teams)
        )

    def active_ids(self) -> list[str]:
        return sorted(p.id for p in self.projects.values() if p.active)


def _str_set(value: Any) -> frozenset[str]:
    if value is None:
        return frozenset()
    if isinstance(value, str):
        return frozenset(v for v in re.split(r"[\s,;]+", value) if v)
    return frozenset(str(v) for v in value)


def _check_id(pid: str, where: str) -> str:
    if not PROJECT_ID.fullmatch(pid):
        raise ParseError(f"{where}: invalid project id {pid!r} (letters, digits, . _ -; at most 63)")
    return pid


def registry_from_data(data: Any, where: str = "registry") -> Registry:
    """YAML/JSON shape: {projects: [{id, cost_centre, description, members, teams, active}], defaults: {user: id}}."""
    if not isinstance(data, Mapping):
        raise ParseError(f"{where}: expected a mapping with `projects` and `defaults`")
    projects: dict[str, Project] = {}
    raw = data.get("projects") or []
    if isinstance(raw, Mapping):  # {id: {...}} form
        raw = [{"id": k, **(v or {})} for k, v in raw.items()]
    for i, p in enumerate(raw):
        if not isinstance(p, Mapping) or "id" not in p:
            raise ParseError(f"{where}: projects[{i}] needs an `id`")
        pid = _check_id(str(p["id"]), f"{where}: projects[{i}]")
        if pid in projects:
            raise ParseError(f"{where}: project {pid!r} defined twice")
        projects[pid] = Project(
            id=pid,
            cost_centre=str(p["cost_centre"]) if p.get("cost_centre") is not None else None,
            description=p.get("description"),
            members=_str_set(p.get("members")),
            teams=_str_set(p.get("teams")),
            active=bool(p.get("active", True)),
        )
        for user in _str_set(p.get("default_for")):
            data = {**data, "defaults": {**(data.get("defaults") or {}), user: pid}}
    defaults = {str(u): str(pid) for u, pid in (data.get("defaults") or {}).items()}
    for user, pid in defaults.items():
        if pid not in projects:
            raise ParseError(f"{where}: default project {pid!r} of user {user!r} is not in the registry")
    return Registry(projects, defaults)


def registry_from_csv(text: str, where: str = "registry.csv") -> Registry:
    """CSV columns: project,cost_centre,description,members,teams,default_for,active (members etc. space-separated)."""
    reader = csv.DictReader(io.StringIO(text))
    if reader.fieldnames is None or "project" not in reader.fieldnames:
        raise ParseError(f"{where}: header must name a `project` column")
    projects: list[dict[str, Any]] = []
    for lineno, row in enumerate(reader, start=2):
        pid = (row.get("project") or "").strip()
        if not pid:
            raise ParseError(f"{where}:{lineno}: empty project id")
        active = (row.get("active") or "true").strip().lower() not in ("false", "0", "no")
        projects.append(
            {
                "id": pid,
                "cost_centre": (row.get("cost_centre") or "").strip() or None,
                "description": (row.get("description") or "").strip() or None,
                "members": row.get("members") or "",
                "teams": row.get("teams") or "",
                "default_for": row.get("default_for") or "",
                "active": active,
            }
        )
    return registry_from_data({"projects": projects}, where)


def registry_from_text(text: str, where: str, csv_format: bool = False) -> Registry:
    if csv_format:
        return registry_from_csv(text, where)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ParseError(f"{where}: {exc}") from exc
    return registry_from_data(data, where)


def load_registry(source: Path | str) -> Registry:
    """A registry file (YAML/JSON, or CSV by suffix), or an http(s) URL serving one (CSV when the URL ends
    in .csv or the server says text/csv)."""
    text_source = str(source)
    if text_source.startswith(("http://", "https://")):
        import httpx

        try:
            resp = httpx.get(text_source, timeout=10.0, follow_redirects=True)
            resp.raise_for_status()
        except httpx.HTTPError as exc:
            raise ConfigError(f"cannot fetch project registry {text_source}: {exc}") from exc
        is_csv = text_source.lower().split("?", 1)[0].endswith(".csv") or "csv" in resp.headers.get(
            "content-type", "")
        return registry_from_text(resp.text, text_source, is_csv)
    path = Path(source)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read project registry {path}: {exc}") from exc
    return registry_from_text(text, str(path), path.suffix.lower() == ".csv")


# ------------------------------------------------------------------------------------------------
# Where the project comes from on a job


def parse_comment_pairs(comment: str | None) -> dict[str, str]:
    """`project=atlas,checkpoint=yes` / `project:atlas; x=y` -> {'project': 'atlas', ...}."""
    out: dict[str, str] = {}
    if not comment:
        return out
    for piece in re.split(r"[,;\s]+", comment):
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)[=:](.*)", piece)
        if m:
            out[m.group(1).lower()] = m.group(2)
    return out


@dataclass(frozen=True, slots=True)
class ProjectRule:
    """Where to read a Slurm job's project, in priority order: `wckey`, `comment:<key>`, `account`."""

    slurm_from: tuple[str, ...] = ("wckey", "comment:project", "account")
    account_map: Mapping[str, str] = field(default_factory=dict)
    kube_label: str = "gpuledger.io/project"
    mode: Mode = "grace"

    def __post_init__(self) -> None:
        for place in self.slurm_from:
            if place not in ("wckey", "account") and not place.startswith("comment:"):
                raise ConfigError(f"project source {place!r}: use wckey, account or comment:<key>")

    def slurm_project(self, wckey: str | None, comment: str | None, account: str | None) -> str | None:
        pairs = parse_comment_pairs(comment)
        for place in self.slurm_from:
            value: str | None
            if place == "wckey":
                value = wckey
            elif place == "account":
                value = self.account_map.get(account, account) if account else None
            else:
                value = pairs.get(place.split(":", 1)[1].lower())
            if value:
                return value.strip()
        return None


@dataclass(frozen=True, slots=True)
class Attribution:
    project: str | None
    source: str  # EXPLICIT, DEFAULT, MISSING
    validation: str  # VALID, UNKNOWN_PROJECT, NOT_A_MEMBER, NOT_CHECKED
    cost_centre: str | None = None
    claimed: str | None = None  # an explicit project the user is not a member of: recorded, never charged


class Attributor:
    """Resolves a job's project against the registry, in grace or strict mode."""

    def __init__(self, registry: Registry | None, rule: ProjectRule | None = None) -> None:
        self.registry = registry
        self.rule = rule or ProjectRule()

    def validate(self, project: str, user: str, teams: frozenset[str] = frozenset()) -> str:
        if self.registry is None:
            return "NOT_CHECKED"
        p = self.registry.get(project)
        if p is None:
            return "UNKNOWN_PROJECT"
        return "VALID" if p.admits(user, teams) else "NOT_A_MEMBER"

    def _cost_centre(self, project: str | None) -> str | None:
        if project is None or self.registry is None:
            return None
        p = self.registry.get(project)
        return p.cost_centre if p else None

    def resolve(self, user: str, explicit: str | None, teams: frozenset[str] = frozenset()) -> Attribution:
        if explicit:
            verdict = self.validate(explicit, user, teams)
            if verdict == "NOT_A_MEMBER":
                return self._claimed(user, explicit, teams)
            if verdict in ("VALID", "NOT_CHECKED") or self.rule.mode == "strict":
                return Attribution(explicit, "EXPLICIT", verdict, self._cost_centre(explicit))
        if self.rule.mode == "grace" and self.registry is not None:
            default = self.registry.default_for(user)
            if default is not None:
                return Attribution(default, "DEFAULT", self.validate(default, user, teams), self._cost_centre(default))
        if explicit:  # grace, invalid, and no default to fall back on: keep what was given, flagged
            return Attribution(explicit, "EXPLICIT", self.validate(explicit, user, teams), None)
        return Attribution(None, "MISSING", "NOT_CHECKED", None)

    def _claimed(self, user: str, claimed: str, teams: frozenset[str]) -> Attribution:
        """A non-member's explicit project: charged to the user's default (in either mode), the claim kept."""
        default = self.registry.default_for(user) if self.registry is not None else None
        if default is not None:
            return Attribution(
                default, "DEFAULT", self.validate(default, user, teams), self._cost_centre(default), claimed
            )
        return Attribution(None, "MISSING", "NOT_A_MEMBER", None, claimed)

    def resolve_slurm(
        self,
        user: str,
        wckey: str | None,
        comment: str | None,
        account: str | None,
        teams: frozenset[str] = frozenset(),
    ) -> Attribution:
        return self.resolve(user, self.rule.slurm_project(wckey, comment, account), teams)

    def resolve_labels(
        self, user: str, labels: Mapping[str, str] | None, teams: frozenset[str] = frozenset()
    ) -> Attribution:
        return self.resolve(user, (labels or {}).get(self.rule.kube_label), teams)
