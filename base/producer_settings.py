"""Producer settings: the scheduler sources (Slurm, Kubernetes, registry, identity) and the DCGM targets.

The `scheduler` and `dcgm` sections of `base.settings.Settings` (TOML `[scheduler]`, `[dcgm]`; env
`GPULEDGER_SCHEDULER__...`, `GPULEDGER_DCGM__...`). They were read from the untyped `extra` section
before (`[extra.scheduler]`, `[extra.dcgm]`); `Settings` still accepts those, with a deprecation
warning. An unknown key is refused (a typo would otherwise be a silent default); command-line options
override these values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, field_validator


class SchedulerSettings(BaseModel):
    """The scheduler sources: project attribution, Slurm (commands or slurmrestd, spool, jobcomp), Kubernetes."""

    model_config = ConfigDict(extra="forbid")

    registry: str | None = None  # project registry: a YAML/CSV file, or an http(s) URL serving one
    directory: Path | None = None  # identity directory file (YAML/JSON)
    device_map: Path | None = None  # node GPU map file {cluster: {node: {index: uuid}}}
    device_map_from_inventory: bool = True  # also read the inventory topic at start
    mode: Literal["grace", "strict"] = "grace"
    project_from: list[str] = Field(default_factory=lambda: ["wckey", "comment:project", "account"])
    account_map: dict[str, str] = Field(default_factory=dict)
    kube_label: str = "gpuledger.io/project"
    help_url: str | None = None
    pricing_tier: str = "on-prem"
    # An explicit override of which Slurm QOS / Kubernetes priority classes are priced as preemptible. Empty
    # (the default): the policy's preemptible tier (policy_path), else the conventional names without a policy
    # (producers/preemptible.py; docs/policy.md "Which jobs are preemptible").
    preemptible_qos: list[str] = Field(default_factory=list)
    slurm_timezone: str = "UTC"  # zone of scontrol/jobcomp local times
    poll_interval_s: float = Field(default=30.0, gt=0)
    squeue: list[str] = Field(default_factory=lambda: ["squeue", "--json"], min_length=1)
    scontrol: list[str] = Field(default_factory=lambda: ["scontrol", "show", "job", "-d"], min_length=1)
    sacct: list[str] = Field(default_factory=lambda: ["sacct", "--json", "-X", "--allusers"], min_length=1)
    # slurmrestd instead of the commands: base URL, data_parser version, JWT user and token (file)
    slurmrestd_url: str | None = None
    slurmrestd_version: str = "v0.0.41"
    slurmrestd_user: str | None = None
    slurmrestd_token_file: Path | None = None
    spool_dir: Path = Path("/var/spool/gpuledger")
    jobcomp_topic: str = "slurm-jobcomp"
    kubeconfig: Path | None = None
    dcgm_urls: list[str] = Field(default_factory=list)  # dcgm-exporter /metrics for pod -> UUID labels

    @field_validator("slurm_timezone")
    @classmethod
    def _known_zone(cls, name: str) -> str:
        try:
            ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError('an IANA time zone name is expected, e.g. "UTC" or "Europe/Berlin"') from None
        return name

    @field_validator("slurmrestd_url", "dcgm_urls")
    @classmethod
    def _http_urls(cls, value: str | list[str] | None) -> str | list[str] | None:
        for url in [value] if isinstance(value, str) else value or []:
            if not url.startswith(("http://", "https://")):
                raise ValueError("an http(s) URL is expected")
        return value


class DcgmTarget(BaseModel):
    """One dcgm-exporter endpoint; `node` defaults to the hostname the exporter reports."""

    model_config = ConfigDict(extra="forbid")

    url: str
    node: str | None = None
    exporter_version: str | None = None


class DcgmTargetTemplate(BaseModel):
    """One endpoint per node: `url_template` with `{node}` (e.g. "http://{node}:9400/metrics")."""

    model_config = ConfigDict(extra="forbid")

    url_template: str
    nodes: list[str] = Field(default_factory=list)
    exporter_version: str | None = None


class DcgmSettings(BaseModel):
    """The DCGM producer (`gpuledger dcgm run`): its targets when the command line names none."""

    model_config = ConfigDict(extra="forbid")

    # A URL, a {url, node, exporter_version} table or a {url_template, nodes, exporter_version} table each.
    targets: list[str | DcgmTarget | DcgmTargetTemplate] = Field(default_factory=list)

    @field_validator("targets")
    @classmethod
    def _http_targets(
        cls, targets: list[str | DcgmTarget | DcgmTargetTemplate]
    ) -> list[str | DcgmTarget | DcgmTargetTemplate]:
        for target in targets:
            if isinstance(target, str):
                url = target
            else:
                url = target.url if isinstance(target, DcgmTarget) else target.url_template
            if not url.startswith(("http://", "https://")):
                raise ValueError("each target is an http(s) URL, {url = ...} or {url_template = ..., nodes = [...]}")
        return targets
