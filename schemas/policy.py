"""The organisation's GPU policy (`policy.yaml`): teams, guaranteed quota per generation, borrowing and
lending, priority tiers and who preempts whom, the preemptible discount, interactive limits, fair share.

A typed model and a loader, at the contracts layer so that the renderers (producers/policy_*.py), the
rate card and the reports (sinks/) all read the same file the same way. Loading is pure apart from
reading the file: text in, a `Policy` out, or a `PolicyError` holding one line per problem, each
`file:line: what`, and nothing else. Line numbers come from yaml's composed nodes, so a problem found
after parsing (an unknown team, a preemption cycle) still points at its line.

```yaml
version: 1
generations:                # the GPU generations the policy speaks of (names from schemas/generations.csv)
  hopper: {slurm_gres: h100, kueue_flavor: h100, fleet_gpus: 2, node_labels: {nvidia.com/gpu.product: ...}}
tiers:                      # priority order is by `priority`; `preempts` names lower tiers only
  - {name: production, priority: 1000, preempts: [sweeps]}
  - {name: sweeps, priority: 10}
preemptible: {tier: sweeps, discount: "0.40"}   # the rate card charges this tier's work this much less
interactive: {tier: interactive, max_gpus_per_user: 2, max_session_hours: 8}
fair_share: {mode: decay, half_life_days: 7}    # or mode: accumulate (no decay)
attribution: {mode: strict, baseline: 2026-03-01} # issue 38: every job names its project from this day (the
                            # baseline; without a date, the day a strict policy was first applied)
idle: {idle_after_min_interactive: 30, grace_min: 15}  # issue 43: optional, over the processors' settings
governance:                 # issue 19: who decides appeals and approves reservations, and their limits
  operators: [ops1]
  appeals: {deciders: [ops1], deadline_hours: 72, window_days: 60, max_credit: "500.00"}
  reservations: {max_hours: 168, max_lead_days: 30, auto_approve_gpus: 8, auto_approve_hours: 48,
                 idle_warn_minutes: 30, idle_release_minutes: 60}
  escalations: {tier: production, askers: [user, leads, operators], deciders: [ops1], decide_within_hours: 4,
                max_hours: 24, price_per_gpu_hour: "1.50"}   # issue 41: raising a job's priority for a while
  pruners: [root, "system:serviceaccount:gpuledger:gpuledger-policy"]  # issue 41: may `policy apply --prune`
teams:
  - {name: vision, slurm_account: vision, namespaces: [vision], tiers: [production, sweeps],
     quota: {hopper: 2}, borrowing_limit: {hopper: 1}, lending_limit: {hopper: 2}, shares: 1,
     leads: [carol]}        # issue 41: a lead may resume the team's reclaimed jobs (so may owners, operators)
robots:                     # issue 38: who owns each robot account (a Kubernetes service account or a Slurm user)
  - {account: "system:serviceaccount:vision:ci-robot", team: vision, project: vision-seg}
```
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from base.errors import ConfigError
from base.processor_settings import IdlePolicy
from schemas.generations import UNKNOWN, generation_of, generation_table

MAX_FILE_BYTES = 1 << 20
MAX_TEAMS = 1000
MAX_TIERS = 32
MAX_GENERATIONS = 32
MAX_NAMESPACES = 64
MAX_MEMBERS = 10_000
MAX_DEPTH = 16  # a policy is at most 4 levels deep
MAX_NODES = 200_000  # YAML nodes in the file: a bound on work before any model sees it
MAX_GPUS = 1_000_000
MAX_IDLE_MIN = 31 * 24 * 60  # a month of minutes: idle thresholds and graces
DEFAULT_HALF_LIFE_DAYS = Decimal(7)
EARLIEST_BASELINE, LATEST_BASELINE = dt.date(2000, 1, 1), dt.date(2100, 12, 31)

# Slurm account/QOS names and Kubernetes object names: one lower-case DNS label keeps both engines happy.
_NAME = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
_USER = r"^[A-Za-z0-9_][-A-Za-z0-9_.]{0,63}$"
_PROJECT = r"^[A-Za-z0-9][-A-Za-z0-9_.]{0,127}$"
# A Kubernetes service account as the API server names it: system:serviceaccount:<namespace>:<name>.
_SERVICE_ACCOUNT = r"system:serviceaccount:([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?):([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?)"
_LABEL_KEY = r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
_LABEL_VALUE = r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$"


class PolicyError(ConfigError):
    """A policy file with problems; `problems` holds one `file:line: what` per problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Generation(_Strict):
    slurm_gres: str = Field(pattern=r"^[A-Za-z0-9_.]{1,32}$")  # the gres type: gres/gpu:<slurm_gres>
    kueue_flavor: str = Field(pattern=_NAME)
    fleet_gpus: int | None = Field(default=None, ge=0, le=MAX_GPUS)  # known fleet size: quota must fit
    node_labels: dict[str, str] = Field(default_factory=dict, max_length=16)


class Tier(_Strict):
    name: str = Field(pattern=_NAME)
    priority: int = Field(ge=0, le=1_000_000_000)
    preempts: tuple[str, ...] = Field(default=(), max_length=MAX_TIERS)
    description: str = Field(default="", max_length=2048)


class Preemptible(_Strict):
    tier: str
    discount: Decimal = Field(ge=0, lt=1, max_digits=6)


class Interactive(_Strict):
    tier: str
    max_gpus_per_user: int = Field(ge=0, le=MAX_GPUS)
    max_session_hours: Decimal = Field(gt=0, le=24 * 366, max_digits=8)


class FairShare(_Strict):
    mode: Literal["decay", "accumulate"] = "decay"
    half_life_days: Decimal | None = Field(default=None, gt=0, le=3650, max_digits=8)
    weight_fairshare: int = Field(default=10_000, ge=0, le=1 << 31)
    weight_age: int = Field(default=1_000, ge=0, le=1 << 31)
    weight_qos: int = Field(default=10_000, ge=0, le=1 << 31)
    weight_job_size: int = Field(default=0, ge=0, le=1 << 31)
    max_age_days: int = Field(default=7, ge=0, le=3650)

    @property
    def half_life(self) -> Decimal | None:
        """Days over which unused share halves; None: usage accumulates (never decays)."""
        if self.mode == "accumulate":
            return None
        return self.half_life_days if self.half_life_days is not None else DEFAULT_HALF_LIFE_DAYS


class Team(_Strict):
    name: str = Field(pattern=_NAME)
    slurm_account: str | None = Field(default=None, pattern=_NAME)  # default: the team's name
    namespaces: tuple[str, ...] = Field(default=(), max_length=MAX_NAMESPACES)
    members: tuple[str, ...] = Field(default=(), max_length=MAX_MEMBERS)  # Slurm users of the account
    leads: tuple[str, ...] = Field(default=(), max_length=MAX_MEMBERS)  # may resume the team's reclaimed jobs
    tiers: tuple[str, ...] = Field(default=(), max_length=MAX_TIERS)  # empty: every tier
    quota: dict[str, int] = Field(default_factory=dict, max_length=MAX_GENERATIONS)
    borrowing_limit: dict[str, int] = Field(default_factory=dict, max_length=MAX_GENERATIONS)
    lending_limit: dict[str, int] = Field(default_factory=dict, max_length=MAX_GENERATIONS)
    shares: int = Field(default=1, ge=1, le=1 << 31)

    @property
    def account(self) -> str:
        return self.slurm_account or self.name


class Robot(_Strict):
    """A robot account and who owns it (issue 38: "a robot identity that belongs to everyone and nobody"): the
    directory and the job page name its team and project; a robot nobody owns is shown as such. `account` is the
    name jobs run as: `system:serviceaccount:<namespace>:<name>` on Kubernetes, a user name on Slurm. Ownership is
    by name: every identifier the account has had (a recreated service account) is the same owner's."""

    account: str = Field(max_length=320)
    team: str
    project: str | None = Field(default=None, pattern=_PROJECT)
    description: str = Field(default="", max_length=512)

    @property
    def service_account(self) -> tuple[str, str] | None:
        """(namespace, name) of a Kubernetes service account, None for a Slurm user."""
        found = re.fullmatch(_SERVICE_ACCOUNT, self.account)
        return (found.group(1), found.group(3)) if found else None


class AppealRules(_Strict):
    """Who decides appeals and by when (issue 19). Deciders: the users who may decide; none listed, the operators."""

    deciders: tuple[str, ...] = Field(default=(), max_length=MAX_MEMBERS)
    deadline_hours: int = Field(default=72, ge=1, le=24 * 366)  # undecided longer than this: escalated
    window_days: int = Field(default=60, ge=1, le=3660)  # an appeal is filed at most this long after its alert or job
    max_credit: Decimal = Field(default=Decimal("1000"), ge=0, le=MAX_GPUS, max_digits=12, decimal_places=2)
    max_exemption_hours: int = Field(default=168, ge=0, le=24 * 366)


class ReservationRules(_Strict):
    """Self-service reservations (issue 19): a team member reserves up to what the team may hold of a generation
    (quota + borrowing limit, and `max_gpus` when lower), at most `max_lead_days` ahead, for at most `max_hours`
    (extensions included). Up to `auto_approve_gpus` GPUs for `auto_approve_hours` is approved at once; more
    waits for an operator. A reservation idle `idle_release_minutes` is released early (None: never)."""

    max_gpus: dict[str, int] = Field(default_factory=dict, max_length=MAX_GENERATIONS)
    max_hours: int = Field(default=168, ge=1, le=24 * 366)
    max_lead_days: int = Field(default=30, ge=0, le=366)
    auto_approve_gpus: int = Field(default=8, ge=0, le=MAX_GPUS)
    auto_approve_hours: int = Field(default=48, ge=0, le=24 * 366)
    idle_warn_minutes: int | None = Field(default=None, ge=1, le=24 * 60 * 31)
    idle_release_minutes: int | None = Field(default=None, ge=1, le=24 * 60 * 31)


ASKER_ROLES = ("user", "members", "leads", "operators")


class EscalationRules(_Strict):
    """Raising a job's priority for a while (issue 41 item 5, `schemas/governance_escalations.py`). Who may ask:
    `askers`, roles of the job's user (`user`), its team's `members` or `leads`, and the `operators`. Who decides:
    `deciders` (none listed: the operators), within `decide_within_hours` or the request lapses. A grant runs the
    job at `tier` (its QOS on Slurm, its WorkloadPriorityClass on Kueue) for the hours asked, at most `max_hours`,
    then it falls back. `price_per_gpu_hour`, when stated, puts the raised hours on the team's statement."""

    tier: str
    askers: tuple[Literal["user", "members", "leads", "operators"], ...] = Field(
        default=("user", "leads", "operators"), min_length=1, max_length=len(ASKER_ROLES))
    deciders: tuple[str, ...] = Field(default=(), max_length=MAX_MEMBERS)
    decide_within_hours: int = Field(default=24, ge=1, le=24 * 31)
    max_hours: int = Field(default=24, ge=1, le=24 * 31)
    price_per_gpu_hour: Decimal | None = Field(default=None, ge=0, le=1_000_000, max_digits=12, decimal_places=4)


class Governance(_Strict):
    operators: tuple[str, ...] = Field(default=(), max_length=MAX_MEMBERS)  # approve reservations, decide appeals
    appeals: AppealRules = Field(default_factory=AppealRules)
    reservations: ReservationRules = Field(default_factory=ReservationRules)
    escalations: EscalationRules | None = None  # None: no job's priority may be raised
    # who may `policy apply --prune` (issue 41), as the engine knows them: an OS user (Slurm) or a Kubernetes user,
    # service accounts as system:serviceaccount:<namespace>:<name>; none listed: nobody
    pruners: tuple[str, ...] = Field(default=(), max_length=MAX_MEMBERS)

    @property
    def deciders(self) -> tuple[str, ...]:
        return self.appeals.deciders or self.operators


class AttributionRules(_Strict):
    """When attribution became required (issue 38, `docs/policy.md` "The attribution baseline"). `mode`: grace (a job
    without a project is charged to its user's default) or strict (the scheduler rejects it); unstated, the
    scheduler settings' mode. `baseline`: the day from which every job names its project, when the organisation
    states one; unstated, the day a strict policy is first applied. `policy apply` records it
    (attribution.baseline.v1, schemas/governance_baseline.py)."""

    mode: Literal["grace", "strict"] | None = None
    baseline: dt.date | None = None

    @field_validator("baseline", mode="before")
    @classmethod
    def _a_day(cls, value: Any) -> Any:
        # pydantic would take a number as a Unix time and a datetime's day; only a day as YAML or ISO text is one
        if value is None or (isinstance(value, dt.date) and not isinstance(value, dt.datetime)):
            return value
        if isinstance(value, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
            return value
        raise ValueError(f"a day as YYYY-MM-DD, got {str(value)[:40]!r}")


class KueueOptions(_Strict):
    cohort: str = Field(default="gpuledger", pattern=_NAME)
    resource: str = Field(default="nvidia.com/gpu", pattern=r"^[a-z0-9.\-]{1,253}/[a-z0-9.\-]{1,63}$")
    # how often Kueue samples the LocalQueues' usage for admission fair sharing (its default: 5 minutes)
    usage_sampling_seconds: int = Field(default=300, ge=1, le=86_400)


class IdleRules(_Strict):
    """When an idle job is warned and reclaimed (issue 43: a proposal states these for `policy whatif`). Each
    field left out keeps the processors' own setting (`processor.idle`), so a policy without the section
    changes nothing."""

    idle_after_min_interactive: int | None = Field(default=None, ge=1, le=MAX_IDLE_MIN)
    idle_after_min_batch: int | None = Field(default=None, ge=1, le=MAX_IDLE_MIN)
    idle_after_min_by_partition: dict[str, int] | None = Field(default=None, max_length=MAX_TIERS)
    idle_after_min_by_project: dict[str, int] | None = Field(default=None, max_length=MAX_TEAMS)
    grace_min: int | None = Field(default=None, ge=0, le=MAX_IDLE_MIN)

    @field_validator("idle_after_min_by_partition", "idle_after_min_by_project")
    @classmethod
    def _minutes(cls, value: dict[str, int] | None) -> dict[str, int] | None:
        for name, minutes in (value or {}).items():
            if not 1 <= minutes <= MAX_IDLE_MIN:
                raise ValueError(f"{name}: idle minutes must be 1..{MAX_IDLE_MIN}, got {minutes}")
        return value

    def over(self, base: IdlePolicy) -> IdlePolicy:
        """`base` (the processors' settings) with the fields this section states."""
        stated = {k: v for k, v in self.model_dump().items() if v is not None}
        return base.model_copy(update=stated)


class Policy(_Strict):
    version: Literal[1]
    generations: dict[str, Generation] = Field(min_length=1, max_length=MAX_GENERATIONS)
    tiers: tuple[Tier, ...] = Field(min_length=1, max_length=MAX_TIERS)
    preemptible: Preemptible | None = None
    interactive: Interactive | None = None
    fair_share: FairShare = Field(default_factory=FairShare)
    attribution: AttributionRules = Field(default_factory=AttributionRules)
    kueue: KueueOptions = Field(default_factory=KueueOptions)
    governance: Governance = Field(default_factory=Governance)
    teams: tuple[Team, ...] = Field(min_length=1, max_length=MAX_TEAMS)
    robots: tuple[Robot, ...] = Field(default=(), max_length=MAX_MEMBERS)
    idle: IdleRules | None = None

    def idle_policy(self, base: IdlePolicy) -> IdlePolicy:
        """The idle policy this policy puts in force over the processors' `base` (issue 43)."""
        return base if self.idle is None else self.idle.over(base)

    def robot(self, account: str) -> Robot | None:
        """Who owns the robot account `account` (the name a job ran as), or None when the policy names no owner."""
        return next((r for r in self.robots if r.account == account), None)

    def tier(self, name: str) -> Tier:
        return next(t for t in self.tiers if t.name == name)

    def team(self, name: str) -> Team:
        return next(t for t in self.teams if t.name == name)

    def team_tiers(self, team: Team) -> tuple[str, ...]:
        """The team's tiers, highest priority first (all tiers when the team names none)."""
        names = set(team.tiers) if team.tiers else {t.name for t in self.tiers}
        return tuple(t.name for t in self.tiers_by_priority() if t.name in names)

    def tiers_by_priority(self) -> tuple[Tier, ...]:
        return tuple(sorted(self.tiers, key=lambda t: (-t.priority, t.name)))

    @property
    def preemptible_discount(self) -> Decimal:
        return self.preemptible.discount if self.preemptible else Decimal(0)


# -- YAML with line numbers -----------------------------------------------------------------------

Path_ = tuple[str | int, ...]


@dataclass(frozen=True)
class _Located:
    data: Any
    lines: dict[Path_, int]  # path in the data -> 1-based line of its node


def _compose(text: str, origin: str) -> _Located:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except RecursionError as exc:
        raise PolicyError([f"{origin}: nested deeper than YAML can be read"]) from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{origin}:{mark.line + 1}" if mark is not None else origin
        raise PolicyError([f"{where}: not valid YAML: {getattr(exc, 'problem', None) or exc}"]) from exc
    if root is None:
        raise PolicyError([f"{origin}:1: the policy file is empty"])
    lines: dict[Path_, int] = {}
    seen: set[int] = set()
    problems: list[str] = []

    def build(node: yaml.Node, path: Path_) -> Any:
        if id(node) in seen:  # an alias: the same node twice. Refused (it is how YAML bombs grow).
            problems.append(f"{origin}:{node.start_mark.line + 1}: YAML aliases are not allowed in a policy")
            return None
        seen.add(id(node))
        if len(seen) > MAX_NODES:
            raise PolicyError([f"{origin}: more than {MAX_NODES} YAML nodes"])
        if len(path) > MAX_DEPTH:
            raise PolicyError([f"{origin}:{node.start_mark.line + 1}: nested deeper than {MAX_DEPTH} levels"])
        lines[path] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                key = _scalar(loader, key_node)
                if key in out:
                    problems.append(f"{origin}:{key_node.start_mark.line + 1}: duplicate key {key!r}")
                out[key] = build(value_node, (*path, key))
            return out
        if isinstance(node, yaml.SequenceNode):
            return [build(item, (*path, i)) for i, item in enumerate(node.value)]
        return _scalar(loader, node)

    loader = yaml.SafeLoader("")
    data = build(root, ())
    if problems:
        raise PolicyError(problems)
    return _Located(data, lines)


def _scalar(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    if not isinstance(node, yaml.ScalarNode):
        return f"<{node.tag}>"  # a complex key: kept as text so the model rejects it by name
    try:
        return loader.construct_object(node, deep=False)
    except ValueError:  # looks like a timestamp but is none (2026-13-01): the text, for the model to refuse by line
        return str(node.value)


def _line(located: _Located, path: Path_) -> int:
    """The line of `path`, or of its nearest ancestor the file has (a missing key: its parent's line)."""
    for end in range(len(path), -1, -1):
        line = located.lines.get(path[:end])
        if line is not None:
            return line
    return 1


def _dotted(path: Path_) -> str:
    return ".".join(str(p) for p in path) or "(top level)"


# -- checks beyond the types ----------------------------------------------------------------------


def _preemption_cycle(tiers: tuple[Tier, ...]) -> list[str] | None:
    """One cycle of `preempts` edges, as the tier names along it, or None."""
    edges = {t.name: [p for p in t.preempts] for t in tiers}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        path.append(name)
        for nxt in edges.get(name, []):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt in edges and state.get(nxt) is None:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[name] = 2
        return None

    for name in sorted(edges):
        if state.get(name) is None:
            found = visit(name)
            if found:
                return found
    return None


def _tier_problems(policy: Policy) -> Iterator[tuple[Path_, str]]:
    names = [t.name for t in policy.tiers]
    index = {n: i for i, n in enumerate(names)}
    for i, tier in enumerate(policy.tiers):
        if names.index(tier.name) != i:
            yield ("tiers", i, "name"), f"tier {tier.name!r} is defined twice"
        for j, target in enumerate(tier.preempts):
            if target not in index:
                yield ("tiers", i, "preempts", j), f"tier {tier.name!r} preempts unknown tier {target!r}"
            elif target == tier.name:
                yield ("tiers", i, "preempts", j), f"tier {tier.name!r} preempts itself"
    cycle = _preemption_cycle(policy.tiers)
    if cycle:
        yield ("tiers", index[cycle[0]], "preempts"), "preemption cycle: " + " -> ".join(cycle)
        return
    for i, tier in enumerate(policy.tiers):
        for j, target in enumerate(tier.preempts):
            if target in index and target != tier.name and policy.tiers[index[target]].priority >= tier.priority:
                yield ("tiers", i, "preempts", j), (
                    f"tier {tier.name!r} (priority {tier.priority}) preempts {target!r} of priority "
                    f"{policy.tiers[index[target]].priority}: a tier preempts only lower priorities (Kueue preempts by "
                    "priority)"
                )
    for section in ("preemptible", "interactive"):
        chosen = getattr(policy, section)
        if chosen is not None and chosen.tier not in index:
            yield (section, "tier"), f"{section}.tier names unknown tier {chosen.tier!r}"


def _generation_problems(policy: Policy) -> Iterator[tuple[Path_, str]]:
    known = set(generation_table().values())
    flavors: dict[str, str] = {}
    for name, gen in policy.generations.items():
        if name not in known:
            yield ("generations", name), f"unknown generation {name!r} (known: {', '.join(sorted(known))})"
        elif generation_of(gen.slurm_gres) not in (name, UNKNOWN):
            yield ("generations", name, "slurm_gres"), (
                f"gres type {gen.slurm_gres!r} is a {generation_of(gen.slurm_gres)} GPU, not {name}")
        if gen.kueue_flavor in flavors:
            yield ("generations", name, "kueue_flavor"), (
                f"flavor {gen.kueue_flavor!r} is already the flavor of {flavors[gen.kueue_flavor]}")
        flavors[gen.kueue_flavor] = name
        for key, value in gen.node_labels.items():
            if not re.match(_LABEL_KEY, key) or not re.match(_LABEL_VALUE, value):
                yield ("generations", name, "node_labels", key), f"not a Kubernetes label: {key}={value}"


def _team_problems(policy: Policy) -> Iterator[tuple[Path_, str]]:
    tiers = {t.name for t in policy.tiers}
    seen: dict[str, dict[str, str]] = {"name": {}, "account": {}, "namespace": {}}
    for i, team in enumerate(policy.teams):
        for kind, value, path in (("name", team.name, ("name",)), ("account", team.account, ("slurm_account",))):
            if value in seen[kind]:
                owner = seen[kind][value]
                yield ("teams", i, *path), f"{kind} {value!r} of team {team.name!r} is already team {owner!r}'s"
            seen[kind][value] = team.name
        for j, ns in enumerate(team.namespaces):
            if not re.match(_NAME, ns):
                yield ("teams", i, "namespaces", j), f"{ns!r} is not a Kubernetes namespace name"
            elif ns in seen["namespace"]:
                yield ("teams", i, "namespaces", j), f"namespace {ns!r} is already team {seen['namespace'][ns]!r}'s"
            seen["namespace"][ns] = team.name
        for field_name in ("members", "leads"):
            for j, user in enumerate(getattr(team, field_name)):
                if not re.match(_USER, user):
                    yield ("teams", i, field_name, j), f"{user!r} is not a user name"
        for j, tier in enumerate(team.tiers):
            if tier not in tiers:
                yield ("teams", i, "tiers", j), f"team {team.name!r} names unknown tier {tier!r}"
        for field in ("quota", "borrowing_limit", "lending_limit"):
            for gen, gpus in getattr(team, field).items():
                if gen not in policy.generations:
                    yield ("teams", i, field, gen), f"team {team.name!r}: {field} for unknown generation {gen!r}"
                if gpus < 0 or gpus > MAX_GPUS:
                    yield ("teams", i, field, gen), (
                        f"team {team.name!r}: {field}.{gen} must be 0..{MAX_GPUS}, got {gpus}")
        for gen, lend in team.lending_limit.items():
            if lend >= 0 and lend > team.quota.get(gen, 0):
                yield ("teams", i, "lending_limit", gen), (
                    f"team {team.name!r} lends {lend} {gen} GPUs but is guaranteed {team.quota.get(gen, 0)}")


def _fleet_problems(policy: Policy) -> Iterator[tuple[Path_, str]]:
    for gen, spec in policy.generations.items():
        if spec.fleet_gpus is None:
            continue
        total = sum(t.quota.get(gen, 0) for t in policy.teams)
        if total > spec.fleet_gpus:
            owners = ", ".join(f"{t.name} {t.quota[gen]}" for t in policy.teams if t.quota.get(gen))
            yield ("generations", gen, "fleet_gpus"), (
                f"guaranteed {gen} quota {total} GPUs ({owners}) is above the fleet's {spec.fleet_gpus}")
        for i, team in enumerate(policy.teams):
            cap = team.quota.get(gen, 0) + team.borrowing_limit.get(gen, 0)
            if cap > spec.fleet_gpus:
                yield ("teams", i, "borrowing_limit", gen), (
                    f"team {team.name!r} may hold {cap} {gen} GPUs, the fleet has {spec.fleet_gpus}")


def _governance_problems(policy: Policy) -> Iterator[tuple[Path_, str]]:
    gov = policy.governance
    for where, users in (("operators", gov.operators), ("appeals", gov.appeals.deciders)):
        path: Path_ = ("governance", where) if where == "operators" else ("governance", "appeals", "deciders")
        for j, user in enumerate(users):
            if not re.match(_USER, user):
                yield (*path, j), f"{user!r} is not a user name"
    for j, user in enumerate(gov.pruners):
        if not (re.fullmatch(_USER, user) or re.fullmatch(_SERVICE_ACCOUNT, user)):
            yield ("governance", "pruners", j), (
                f"{user[:80]!r} is neither a user name nor system:serviceaccount:<namespace>:<name>")
    esc = gov.escalations
    if esc is not None:
        for j, user in enumerate(esc.deciders):
            if not re.match(_USER, user):
                yield ("governance", "escalations", "deciders", j), f"{user!r} is not a user name"
        if esc.tier not in {t.name for t in policy.tiers}:
            yield ("governance", "escalations", "tier"), f"escalations.tier names unknown tier {esc.tier!r}"
        if len(set(esc.askers)) != len(esc.askers):
            yield ("governance", "escalations", "askers"), "escalations.askers names a role twice"
    for gen in gov.reservations.max_gpus:
        if gen not in policy.generations:
            yield ("governance", "reservations", "max_gpus", gen), f"max_gpus for unknown generation {gen!r}"
    rules = gov.reservations
    if rules.idle_warn_minutes and rules.idle_release_minutes and rules.idle_warn_minutes >= rules.idle_release_minutes:
        yield ("governance", "reservations", "idle_warn_minutes"), (
            "reservations.idle_warn_minutes must be below idle_release_minutes (the warning comes first)")


def _attribution_problems(policy: Policy) -> Iterator[tuple[Path_, str]]:
    day = policy.attribution.baseline
    if day is not None and not EARLIEST_BASELINE <= day <= LATEST_BASELINE:
        yield ("attribution", "baseline"), (
            f"attribution.baseline {day.isoformat()} is outside {EARLIEST_BASELINE}..{LATEST_BASELINE}")


def _robot_problems(policy: Policy) -> Iterator[tuple[Path_, str]]:
    teams = {t.name for t in policy.teams}
    seen: dict[str, int] = {}
    for i, robot in enumerate(policy.robots):
        if not (re.fullmatch(_SERVICE_ACCOUNT, robot.account) or re.fullmatch(_USER, robot.account)):
            yield ("robots", i, "account"), (
                f"{robot.account[:80]!r} is neither system:serviceaccount:<namespace>:<name> nor a user name")
        if robot.account in seen:
            yield ("robots", i, "account"), f"robot {robot.account!r} is already robots[{seen[robot.account]}]"
        seen.setdefault(robot.account, i)
        if robot.team not in teams:
            yield ("robots", i, "team"), f"robot {robot.account!r} names unknown team {robot.team!r}"


def _semantic_problems(policy: Policy) -> Iterator[tuple[Path_, str]]:
    yield from _attribution_problems(policy)
    yield from _generation_problems(policy)
    yield from _governance_problems(policy)
    yield from _tier_problems(policy)
    yield from _team_problems(policy)
    yield from _fleet_problems(policy)
    yield from _robot_problems(policy)
    fs = policy.fair_share
    if fs.mode == "accumulate" and fs.half_life_days is not None:
        yield ("fair_share", "half_life_days"), (
            "fair_share.mode accumulate takes no half_life_days (usage never decays)")
    if fs.half_life_days is not None and fs.half_life_days * 24 * 60 < Decimal("0.5"):
        # Slurm's half-life is whole minutes and 0 means no decay at all: a shorter one would flip the mode.
        yield ("fair_share", "half_life_days"), (
            f"fair_share.half_life_days {fs.half_life_days} is under a minute (at least 0.0007)")


# -- loading --------------------------------------------------------------------------------------


def _type_problems(exc: ValidationError, located: _Located, origin: str) -> list[tuple[int, str]]:
    out = []
    for err in exc.errors():
        loc: Path_ = tuple(p for p in err["loc"] if isinstance(p, str | int))
        # pydantic's loc for a tuple/list item is the index; for a dict value, the key then the field.
        out.append((_line(located, loc), f"{_dotted(loc)}: {err['msg']}"))
    return out


def parse_policy(text: str, origin: str = "policy.yaml") -> Policy:
    """The policy in `text`, or a PolicyError with every problem found (`origin:line: what`)."""
    if len(text.encode("utf-8")) > MAX_FILE_BYTES:
        raise PolicyError([f"{origin}: larger than {MAX_FILE_BYTES} bytes"])
    located = _compose(text, origin)
    if not isinstance(located.data, Mapping):
        raise PolicyError([f"{origin}:1: the policy must be a mapping (version, generations, tiers, teams)"])
    try:
        policy = Policy.model_validate(located.data)
    except ValidationError as exc:
        found = sorted(set(_type_problems(exc, located, origin)))
        raise PolicyError([f"{origin}:{line}: {what}" for line, what in found]) from None
    problems = sorted({(_line(located, path), what) for path, what in _semantic_problems(policy)})
    if problems:
        raise PolicyError([f"{origin}:{line}: {what}" for line, what in problems])
    return policy


def load_policy(path: Path) -> Policy:
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise PolicyError([f"{path}: larger than {MAX_FILE_BYTES} bytes ({size})"])
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise PolicyError([f"{path}: policy file not found"]) from exc
    except UnicodeDecodeError as exc:
        raise PolicyError([f"{path}: not UTF-8 text"]) from exc
    return parse_policy(text, str(path))
