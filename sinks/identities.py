"""A name and its identifier (issue 38, items 1 and 2): how the ledger shows who a job ran as.

Identity is the user name plus its identifier (`user_uid`: the POSIX uid on Slurm, the stamped requester's uid
on Kubernetes), so an account deleted and recreated under the same name is a second identity, shown as
`ci-robot (uid 3f2a…)` beside `ci-robot (uid 9b1c…)`, never summed into one. Where the name came from
(`user_source`) is shown beside it; a cluster whose jobs' names are only self-declared (no admission stamp seen)
is said so in every report (`cluster_identities`, `self_declared_notes`).

Reads use bound parameters and fixed identifiers (migration 032: job_events' identity columns, v_job_identities).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sinks.periods import check_period

# Where a name comes from (schemas/records.py UserSource), in words; None: an event written before v4.
SOURCE_TEXT: Mapping[str | None, str] = {
    "SCHEDULER": "the scheduler's record",
    "STAMPED": "stamped at admission",
    "SELF_DECLARED": "self-declared (a label the submitter wrote)",
    "NAMESPACE": "the namespace (nothing named a user)",
    None: "not recorded",
}
VERIFIED = frozenset({"SCHEDULER", "STAMPED"})
SELF_DECLARED = frozenset({"SELF_DECLARED", "NAMESPACE"})
MAX_KEYS = 10_000  # jobs whose identities one read asks for (one explain, one page)


def identity_text(user: str, uid: str | None, *, short: bool = False) -> str:
    """`alice (uid 1001)`, `ci-robot (uid 3f2a…)` (short: a long identifier by its first 8 characters),
    `alice (uid unknown)`."""
    if not uid:
        return f"{user} (uid unknown)"
    shown = uid[:8] + "…" if short and len(uid) > 10 else uid
    return f"{user} (uid {shown})"


def source_text(source: str | None) -> str:
    return SOURCE_TEXT.get(source, str(source))


@dataclass(frozen=True, slots=True)
class JobIdentity:
    """Who one life of a job ran as (v_job_identities)."""

    user: str
    uid: str | None
    source: str | None
    claimed: str | None  # a self-declared user that disagreed with the verified one (never charged)
    groups: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        return identity_text(self.user, self.uid)


def job_identities(client: Any, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str, int], JobIdentity]:
    """The identity of every life of the given (cluster, job_id)s, by (cluster, job_id, job_start_ms): the key of
    v_chargeback_jobs' rows and the job page's lives."""
    wanted = sorted(set(keys))[:MAX_KEYS]
    if not wanted:
        return {}
    rows = client.query(
        "SELECT cluster, job_id, job_start_ms, user, user_uid, user_source, user_claimed, user_groups "
        "FROM v_job_identities WHERE (cluster, job_id) IN "
        "(SELECT tupleElement(k, 1), tupleElement(k, 2) FROM (SELECT arrayJoin({keys:Array(Tuple(String, String))}) "
        "AS k))",
        parameters={"keys": wanted},
    ).result_rows
    return {(str(c), str(j), int(s)): JobIdentity(str(u), _opt(uid), _opt(src), _opt(claimed), tuple(groups or ()))
            for c, j, s, u, uid, src, claimed, groups in rows}  # fmt: skip


def _opt(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)


# -- per cluster: whose identities are only self-declared -----------------------------------------


@dataclass(frozen=True, slots=True)
class ClusterIdentities:
    """A cluster's jobs of a month (one team's, when asked) by where their user names came from."""

    cluster: str
    jobs: int
    verified_jobs: int  # SCHEDULER or STAMPED
    self_declared_jobs: int  # SELF_DECLARED or NAMESPACE
    self_declared_s: int  # their allocated seconds
    claimed_user_jobs: int  # a self-declared user disagreed with the verified one

    @property
    def self_declared_gpu_h(self) -> Decimal:
        return (Decimal(self.self_declared_s) / 3600).quantize(Decimal("0.001"))

    def note(self) -> str | None:
        """The line a report prints for this cluster, or None when every identity is verified (or unrecorded)."""
        if not self.self_declared_jobs:
            return None
        if not self.verified_jobs:
            return (f"identities on {self.cluster} are self-declared (the admission stamp is not applied): "
                    f"{self.self_declared_gpu_h} GPU-h of {self.self_declared_jobs} job(s) charged to a name the "
                    "submitter wrote")  # fmt: skip
        return (f"identities on {self.cluster}: {self.self_declared_gpu_h} GPU-h of {self.self_declared_jobs} "
                f"job(s) are self-declared (created without the admission stamp); {self.verified_jobs} job(s) "
                "verified")  # fmt: skip


# The month's jobs (of a team, on a cluster). Their events are picked from job_events by job_id first, then by the
# (cluster, job_id) pair: a set of one column prunes the table's rows at a fraction of a pair set's cost (at 10,000
# GPUs and a year of history, 2.5 M events: 3-4x faster; issue 44 item 6); the pair keeps the pick exact.
_USAGE = (
    "SELECT cluster, job_id, sum(allocated_s) AS a FROM usage_daily "
    "WHERE day >= toDate(concat({p:String}, '-01')) AND day < addMonths(toDate(concat({p:String}, '-01')), 1) "
    "AND job_id != '' AND ({team:String} = '' OR team = {team:String}) "
    "AND ({cluster:String} = '' OR cluster = {cluster:String}) GROUP BY cluster, job_id"
)


def cluster_identities(client: Any, period: str, team: str | None = None,
                       cluster: str | None = None) -> list[ClusterIdentities]:  # fmt: skip
    """Per cluster, the month's jobs (of `team`, on `cluster`, when given) by where their user came from (each
    job's latest event that says). usage_daily's allocated seconds: the daily rollup every page reads."""
    rows = client.query(
        "SELECT u.cluster, count(), countIf(s.src IN ('SCHEDULER', 'STAMPED')), "
        "countIf(s.src IN ('SELF_DECLARED', 'NAMESPACE')), sumIf(u.a, s.src IN ('SELF_DECLARED', 'NAMESPACE')), "
        f"countIf(s.claimed) FROM ({_USAGE}) AS u LEFT JOIN ("
        "  SELECT cluster, job_id, argMax(user_source, ts_ms) AS src, max(user_claimed IS NOT NULL) AS claimed "
        f"  FROM job_events WHERE job_id IN (SELECT job_id FROM ({_USAGE})) "  # first: see _USAGE
        f"  AND (cluster, job_id) IN (SELECT cluster, job_id FROM ({_USAGE})) "
        "  GROUP BY cluster, job_id"
        ") AS s ON u.cluster = s.cluster AND u.job_id = s.job_id GROUP BY u.cluster ORDER BY u.cluster",
        parameters={"p": check_period(period), "team": team or "", "cluster": cluster or ""},
    ).result_rows
    return [ClusterIdentities(str(c), int(n), int(v), int(sd), int(s or 0), int(cl))
            for c, n, v, sd, s, cl in rows]  # fmt: skip


def self_declared_notes(found: Iterable[ClusterIdentities]) -> list[str]:
    return [note for c in found if (note := c.note()) is not None]


# -- who owns a robot -----------------------------------------------------------------------------

SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"  # the API server's name for a service account


def is_robot(user: str, robots: Mapping[str, Any]) -> bool:
    """A Kubernetes service account, or a name the policy lists under `robots:`."""
    return user.startswith(SERVICE_ACCOUNT_PREFIX) or user in robots


def robots_of(policy: Any) -> dict[str, Any]:
    """The policy's robot accounts by name (schemas.policy.Robot); none without a policy."""
    return {} if policy is None else {r.account: r for r in policy.robots}


def owner_text(user: str, robots: Mapping[str, Any]) -> str:
    """Who owns `user` when it is a robot: `team vision, project vision-seg`; `nobody (no robots: entry in
    policy.yaml)` for a robot the policy names no owner of; empty for a person."""
    robot = robots.get(user)
    if robot is not None:
        return f"team {robot.team}" + (f", project {robot.project}" if robot.project else "")
    if user.startswith(SERVICE_ACCOUNT_PREFIX):
        return "nobody (no robots: entry in policy.yaml)"
    return ""
