"""Processor settings: classifier thresholds, windows, idle policy, coverage. Plain pydantic, no IO.

Built once at the entry point (it is the `processor` section of `base.settings.Settings`) and
passed down to the pure core; nothing here reads the environment.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

CLASSIFIER_VERSION = "c1"


class Thresholds(BaseModel):
    """Classifier c1 thresholds (docs/classification.md); the defaults are the documented ones."""

    model_config = {"frozen": True}

    version: str = CLASSIFIER_VERSION
    active_min_ratio: float = 0.25
    starved_min_ratio: float = 0.05
    starved_min_fb_mib: float = 1024.0


class Exemption(BaseModel):
    """A job, user or project that is never idle-warned or reclaimed until `expires_ms`."""

    model_config = {"frozen": True}

    kind: str = Field(pattern="^(job|user|project)$")
    value: str
    reason: str
    expires_ms: int | None = None  # None: no expiry
    starts_ms: int | None = None  # None: from the start (a granted appeal: its decision's time)


class IdlePolicy(BaseModel):
    """When a job counts as abandoned, and what is done about it."""

    model_config = {"frozen": True}

    idle_after_min_interactive: int = 30
    idle_after_min_batch: int = 60
    # Overrides of idle_after (minutes) by scheduler partition/queue, then by project (project wins).
    idle_after_min_by_partition: dict[str, int] = Field(default_factory=dict)
    idle_after_min_by_project: dict[str, int] = Field(default_factory=dict)
    grace_min: int = 15  # minutes between the warning and the action
    # SUSPEND applies to Kueue (deactivation releases the quota); Slurm jobs are requeued all the same, since
    # a suspended Slurm job keeps its GPUs
    reclaim_mode: str = Field(default="REQUEUE", pattern="^(REQUEUE|SUSPEND)$")
    dry_run: bool = True
    appeal_route: str = "Reply in #gpu-help or ask the platform team for an exemption (job, user or project)."
    # Price of one device-hour per accelerator generation, for the "cost so far" evidence. Empty: unknown.
    rate_per_device_hour: dict[str, float] = Field(default_factory=dict)
    exemptions: tuple[Exemption, ...] = ()


class ProcessorSettings(BaseModel):
    """The `processor` section of the settings."""

    thresholds: Thresholds = Field(default_factory=Thresholds)
    grace_ms: int = 10_000  # window grace: a minute closes when the watermark passes end + grace
    # Admission: an event further ahead of the processing clock than this is not admitted (it goes to its
    # topic's DLQ with the reason, and is counted): one bad timestamp must not move a watermark. The clock
    # is the wall clock in real time; in event-time replay the later of the wall clock and the latest event
    # time admitted (windows.Horizon).
    max_future_ms: int = Field(default=300_000, ge=0)
    # Minutes with no sample and no allocation further behind the watermark than this are skipped, not
    # closed one by one (their only rows would be dark coverage), and a partition that has closed nothing
    # yet starts no further back: bounds the minutes one watermark advance closes. Default: the samples
    # topic's retention (2 days).
    max_lookback_ms: int = Field(default=2 * 24 * 3600 * 1000, ge=60_000)
    idle: IdlePolicy = Field(default_factory=IdlePolicy)
    coverage_timeout_ms: int = 120_000
    # Real-time mode: the wall clock also drives window closing and coverage (when inputs are caught up).
    realtime: bool = True
    group_id: str = "gpuledger-processors"
    # How many processes of each kind `up` starts (`processors run` and `processors agents`); they share the
    # partitions of every stage through their consumer groups. At most the stage topics' partition count
    # (schemas/topics.py, 4): a process beyond it would hold nothing (docs/deployment.md, "Several processes").
    instances: int = Field(default=1, ge=1, le=4)
    # Consumer poll batch and the longest a batch of outputs may wait before flush + commit.
    batch_size: int = 2000
    commit_interval_ms: int = 1000
