"""The topic catalogue: every topic's name, subject, key, partitioning and retention in one place."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

DAY_MS = 24 * 3600 * 1000
DLQ_RETENTION_MS = 30 * DAY_MS


@dataclass(frozen=True, slots=True)
class Topic:
    name: str
    subject: str
    key: str  # what the record key is made of, e.g. "cluster/node"
    partitions: int = 4
    replication: int = 1
    cleanup_policy: str = "delete"
    retention_ms: int = 7 * DAY_MS

    @property
    def dlq(self) -> str:
        return f"{self.name}.dlq"

    def dead_letter_topic(self) -> Topic:
        """Where this topic's undecodable or invalid records go: DeadLetter envelopes, kept 30 days."""
        return Topic(self.dlq, "deadletter", self.key, partitions=1, retention_ms=DLQ_RETENTION_MS)


DEVICE_SAMPLES = Topic(
    "telemetry.device-samples.v1", "telemetry.device-samples", "cluster/node", retention_ms=2 * DAY_MS
)
LATE_SAMPLES = Topic("telemetry.device-samples.v1.late", "telemetry.device-samples", "cluster/node")
INVENTORY = Topic(
    "inventory.devices.v1", "inventory.devices", "cluster/node", cleanup_policy="compact", retention_ms=-1
)
JOB_EVENTS = Topic("sched.job-events.v1", "sched.job-events", "cluster/job_id", retention_ms=30 * DAY_MS)
# Job events re-keyed by node so a node's samples and its allocations meet on one worker.
ALLOCATIONS = Topic("sched.allocations.v1", "sched.job-events", "cluster/node", retention_ms=30 * DAY_MS)
CORRECTIONS = Topic("attribution.corrections.v1", "attribution.corrections", "cluster/job_id", retention_ms=-1)
DEVICE_MINUTES = Topic("usage.device-minutes.v1", "usage.device-minutes", "cluster/job_id", retention_ms=30 * DAY_MS)
# Device-minutes bundled by job for the job stage (internal): one record per job where there are one per device.
JOB_DEVICE_MINUTES = Topic(
    "processors.job-device-minutes.v1", "processors.job-device-minutes", "cluster/job_id", retention_ms=7 * DAY_MS
)
JOB_MINUTES = Topic("usage.job-minutes.v1", "usage.job-minutes", "cluster/job_id", retention_ms=30 * DAY_MS)
COVERAGE_MINUTES = Topic(
    "usage.coverage-minutes.v1", "usage.coverage-minutes", "cluster/node", retention_ms=30 * DAY_MS
)
ALERTS = Topic("alerts.v1", "alerts", "cluster/job_id", retention_ms=30 * DAY_MS)
RECLAIM_ACTIONS = Topic("actions.reclaim.v1", "actions.reclaim", "cluster/job_id", retention_ms=30 * DAY_MS)
# Governance workflows (issue 19): every step an event, kept for good (the audit trail and the statements' credits).
APPEALS = Topic("appeals.v1", "appeals", "cluster/job_id", retention_ms=-1)
RESERVATIONS = Topic("reservations.v1", "reservations", "cluster/reservation_id", retention_ms=-1)
# The day attribution became required (issue 38), written by `policy apply`: one organisation-wide fact, kept for good.
ATTRIBUTION_BASELINE = Topic(
    "attribution.baseline.v1", "attribution.baseline", "baseline", partitions=1, retention_ms=-1
)
# Every `policy apply` (issue 41): who, when, which settings before and after; an audit trail, kept for good.
POLICY_APPLIED = Topic("policy.applied.v1", "policy.applied", "cluster/engine", partitions=1, retention_ms=-1)
# Escalations (issue 41): a job's priority raised for a while, decided, applied and reverted; kept for good.
ESCALATIONS = Topic("escalations.v1", "escalations", "cluster/job_id", retention_ms=-1)

# The job stage's idle states (the faust Table's changelog): internal to the processors, not in the catalogue and not
# managed by `topics apply` (the job stage declares it at start); named here because the local stack's ACLs grant on it.
IDLE_STATE_TOPIC = "processors.idle-state.v1"

CATALOGUE: tuple[Topic, ...] = (
    DEVICE_SAMPLES,
    LATE_SAMPLES,
    INVENTORY,
    JOB_EVENTS,
    ALLOCATIONS,
    CORRECTIONS,
    DEVICE_MINUTES,
    JOB_DEVICE_MINUTES,
    JOB_MINUTES,
    COVERAGE_MINUTES,
    ALERTS,
    RECLAIM_ACTIONS,
    APPEALS,
    RESERVATIONS,
    ATTRIBUTION_BASELINE,
    POLICY_APPLIED,
    ESCALATIONS,
)


# Nodes and jobs are known by their cluster-qualified names, "cluster/name" (names repeat across
# clusters). The text form keys the processors' tables; the record key on the wire is the same text
# encoded, made only where a record meets Kafka (`node_key`, `job_key`).


def qualified_node(cluster: str, node: str) -> str:
    return f"{cluster}/{node}"


def split_qualified_node(name: str) -> tuple[str, str]:
    cluster, _, node = name.partition("/")
    return cluster, node


def qualified_job(cluster: str, job_id: str) -> str:
    return f"{cluster}/{job_id}"


def node_key(cluster: str, node: str) -> bytes:
    """The Kafka record key of a record about a node."""
    return qualified_node(cluster, node).encode()


def job_key(cluster: str, job_id: str) -> bytes:
    """The Kafka record key of a record about a job."""
    return qualified_job(cluster, job_id).encode()


@cache
def all_topics() -> tuple[Topic, ...]:
    """The catalogue plus each topic's dead-letter topic: everything `gpuledger topics apply` manages."""
    return tuple(t for topic in CATALOGUE for t in (topic, topic.dead_letter_topic()))


@cache
def _by_name() -> dict[str, Topic]:
    return {t.name: t for t in reversed(all_topics())}  # reversed: the first of a name wins, as a scan would


def topic_named(name: str, prefix: str = "") -> Topic | None:
    """The catalogue entry (or dead-letter topic) of a broker-side topic name, prefix included."""
    if not name.startswith(prefix):
        return None
    return _by_name().get(name[len(prefix) :])
