"""Identity snapshot at job start: who the user was (teams, groups, cost centre) when the job started.

`IdentitySource` is the pluggable interface (a file now; LDAP/SCIM implement the same `lookup`).
The snapshot is embedded in the STARTED event, so a later reorganisation never rewrites history.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from base.errors import ConfigError, ParseError


@dataclass(frozen=True, slots=True)
class DirectoryEntry:
    user: str
    teams: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    cost_centre: str | None = None
    primary_team: str | None = None  # the team usage is reported under; default: the first team
    leads: tuple[str, ...] = ()  # teams this user leads (the team page lets a lead correct the team's jobs)


class IdentitySource(Protocol):
    def lookup(self, user: str) -> DirectoryEntry | None: ...


class StaticDirectory:
    """An in-memory directory (tests, or built from any other source)."""

    def __init__(self, entries: Mapping[str, DirectoryEntry]) -> None:
        self._entries = dict(entries)

    def lookup(self, user: str) -> DirectoryEntry | None:
        return self._entries.get(user)


def directory_from_data(data: Any, where: str = "directory") -> dict[str, DirectoryEntry]:
    """{users: {alice: {teams: [...], groups: [...], cost_centre: CC, leads: [...]}}} (or a list with `user` keys)."""
    if not isinstance(data, Mapping):
        raise ParseError(f"{where}: expected a mapping with `users`")
    users = data.get("users") or {}
    if isinstance(users, list):
        users = {str(u.get("user")): u for u in users if isinstance(u, Mapping)}
    out: dict[str, DirectoryEntry] = {}
    for name, entry in users.items():
        entry = entry or {}
        if not isinstance(entry, Mapping):
            raise ParseError(f"{where}: entry of {name!r} is not a mapping")
        out[str(name)] = DirectoryEntry(
            user=str(name),
            teams=tuple(str(t) for t in entry.get("teams") or ()),
            groups=tuple(str(g) for g in entry.get("groups") or ()),
            cost_centre=str(entry["cost_centre"]) if entry.get("cost_centre") is not None else None,
            primary_team=str(entry["primary_team"]) if entry.get("primary_team") is not None else None,
            leads=tuple(str(t) for t in entry.get("leads") or ()),
        )
    return out


class FileDirectory:
    """A YAML/JSON directory file, re-read when it changes (so the snapshot is of *now*)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._mtime: float | None = None
        self._entries: dict[str, DirectoryEntry] = {}

    def _refresh(self) -> None:
        try:
            mtime = self.path.stat().st_mtime
        except OSError as exc:
            raise ConfigError(f"cannot read directory file {self.path}: {exc}") from exc
        if mtime == self._mtime:
            return
        text = self.path.read_text(encoding="utf-8")
        try:
            data = json.loads(text) if self.path.suffix == ".json" else yaml.safe_load(text)
        except (json.JSONDecodeError, yaml.YAMLError) as exc:
            raise ParseError(f"{self.path}: {exc}") from exc
        self._entries = directory_from_data(data, str(self.path))
        self._mtime = mtime

    def lookup(self, user: str) -> DirectoryEntry | None:
        self._refresh()
        return self._entries.get(user)


def snapshot(
    source: IdentitySource | None,
    user: str,
    ts_ms: int,
    project_cost_centre: str | None = None,
    projects: Callable[[str, frozenset[str]], list[str]] | None = None,
) -> dict[str, Any]:
    """The `IdentitySnapshot` record: project cost centre first, then the user's own.

    `projects(user, teams)` lists the projects the user belongs to (from the registry), recorded as of now.
    """
    entry = source.lookup(user) if source is not None else None
    teams = list(entry.teams) if entry else []
    primary = (entry.primary_team if entry else None) or (teams[0] if teams else None)
    return {
        "user": user,
        "teams": teams,
        "groups": list(entry.groups) if entry else [],
        "projects": projects(user, frozenset(teams)) if projects is not None else [],
        "primary_team": primary,
        "cost_centre": project_cost_centre or (entry.cost_centre if entry else None),
        "snapshot_ts_ms": ts_ms,
    }
