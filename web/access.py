"""Who is asking and what they may see or do: pure, no web framework.

Identity comes from a trusted reverse proxy's headers, believed only when the connection comes from one
of the configured proxy addresses, or, in demo mode, from the user the visitor picked. Roles come from
the directory (teams, the teams a user leads, groups) and the proxy's groups:

- a member sees their teams' pages; a team lead sees the team and corrects any of its jobs;
- a member may correct a job's project only between two projects they are a member of (both);
- operators and finance (configured groups) see every team; operators also correct.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from producers.identity import DirectoryEntry
from producers.projects import Registry

MAX_GROUPS = 256


class Forbidden(Exception):
    """The viewer may not see or do this (HTTP 403); the message says what, never another team's data."""


@dataclass(frozen=True, slots=True)
class Viewer:
    user: str
    teams: frozenset[str] = frozenset()
    leads: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()
    operator: bool = False
    finance: bool = False
    demo: bool = False  # picked in demo mode, not proven by a proxy

    @property
    def sees_everything(self) -> bool:
        return self.operator or self.finance

    @property
    def scope(self) -> str:
        """The active scope in words, shown on every page."""
        if self.operator:
            return "operator: every team"
        if self.finance:
            return "finance: every team"
        parts = [f"lead of {', '.join(sorted(self.leads))}"] if self.leads else []
        members = sorted(self.teams - self.leads)
        if members:
            parts.append(f"member of {', '.join(members)}")
        return "; ".join(parts) or "no team"

    def sees_team(self, team: str) -> bool:
        return self.sees_everything or team in self.teams or team in self.leads

    def visible_teams(self, teams: Iterable[str]) -> list[str]:
        return sorted(t for t in set(teams) if self.sees_team(t))


def viewer_for(
    user: str,
    entry: DirectoryEntry | None,
    *,
    proxy_groups: Iterable[str] = (),
    operator_groups: Iterable[str] = (),
    finance_groups: Iterable[str] = (),
    demo: bool = False,
) -> Viewer:
    groups = frozenset(proxy_groups) | frozenset(entry.groups if entry else ())
    return Viewer(
        user=user,
        teams=frozenset(entry.teams if entry else ()),
        leads=frozenset(entry.leads if entry else ()),
        groups=groups,
        operator=bool(groups & frozenset(operator_groups)),
        finance=bool(groups & frozenset(finance_groups)),
        demo=demo,
    )


def proxy_trusted(peer: str | None, trusted: Iterable[str]) -> bool:
    """Whether the connection's peer address is one of the trusted proxies (addresses or networks)."""
    if not peer:
        return False
    try:
        address = ipaddress.ip_address(peer)
    except ValueError:
        return False
    for entry in trusted:
        try:
            if address in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            continue
    return False


def parse_groups(header: str | None) -> frozenset[str]:
    """oauth2-proxy's `X-Forwarded-Groups`: comma-separated; bounded."""
    if not header:
        return frozenset()
    return frozenset(g.strip() for g in header[:8192].split(",")[:MAX_GROUPS] if g.strip())


def correction_refusal(viewer: Viewer, job_team: str, old_project: str | None, new_project: str,
                       registry: Registry) -> str | None:  # fmt: skip
    """Why `viewer` may not move a job of `job_team` from `old_project` to `new_project`, or None if they may.

    The new project must be an active project of the registry and differ from the old one. Allowed: an
    operator, the team's lead, or a member of both projects (the registry's members or teams)."""
    target = registry.get(new_project)
    if target is None:
        return f"project {new_project!r} is not an active project of the registry"
    if old_project == new_project:
        return f"the job is already charged to {new_project!r}"
    if viewer.operator or job_team in viewer.leads:
        return None
    teams = viewer.teams
    old = registry.get(old_project) if old_project else None
    if old is None:
        return "only the team's lead can move a job whose project is not in the registry"
    if not (old.admits(viewer.user, teams) and target.admits(viewer.user, teams)):
        return "only a member of both projects or the team's lead may move this job"
    return None


def csrf_token(secret: bytes, user: str) -> str:
    """The form token for `user`: forms post it back, and a post without the viewer's token is refused."""
    return hmac.new(secret, f"correct\x1f{user}".encode(), hashlib.sha256).hexdigest()


def csrf_ok(secret: bytes, user: str, token: str | None) -> bool:
    return token is not None and hmac.compare_digest(csrf_token(secret, user), token)
