"""Statements that close (issue 19): pure. No IO, no clock; `sinks/statement_store.py` reads and writes.

A team's statement of a month is its lines:

- **usage**: one per job and rate (a job's segment of the month at one rate: a rate change mid-month
  is two lines), with the allocated / active / starved / idle / dark / unpriced seconds and the exact
  charge numerator (seconds x micro-dollars per GPU-hour; 3.6e9 per dollar). Their cents add up to the
  team's line of `report chargeback --by team` (`allocate_cents` across teams, then across the team's
  lines with `allocate_to_total`), so a statement and the report never disagree on the total.
- **adjustment**: what changed in an already closed month since it was closed (`pending_adjustments`):
  per job, user, project, cost centre, generation and tier, what the ledger says now minus what was
  frozen minus what earlier adjustments already posted. Its cause is the job's attribution correction
  (`correction`, the correction id) when the project changed, otherwise `late-data` when seconds
  changed, otherwise `rate-card` (the card version now loaded). A project correction is two lines (the
  old project reversed, the new one charged), both naming the correction.
- **credit**: an appeal granted as credit (`Credit`), negative, naming the appeal.
- **reservation**: reserved capacity charged on allocation (`Charge` with kind "reservation").

Routing: an item that belongs to month S (an adjustment of closed S, a credit or reservation charge of S)
goes to the earliest month at or after S that is still open, and stays there once that month closes.
Months close in order, so the earliest open month after a closed one is the one being closed next.

Cents: usage lines as above; every other line is its exact numerator rounded half away from zero on its
own. The content hash (`content_hash`) covers every line and figure, not who closed it or when.

Data quality: a statement also freezes the data-quality tally of its team's jobs (`sinks.data_quality.Tally`:
coverage, unidentified devices, default and claimed project shares, unpriced and unknown-MIG hours, overlaps),
in its hash, so the figure a closed month shows is the one it closed with. A statement closed before this
was frozen has none (`quality` None) and keeps the hash it closed with.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

from base.errors import ConfigError
from sinks.data_quality import Tally
from sinks.ratecard import CENT, CENT_UNITS, allocate_cents

KINDS = ("usage", "adjustment", "credit", "reservation")
CAUSES = ("", "correction", "late-data", "rate-card", "appeal", "reservation", "escalation")


def month_after(period: str) -> str:
    year, month = (int(p) for p in period.split("-"))
    return f"{year + month // 12}-{month % 12 + 1:02d}"


def period_end_ms(period: str) -> int:
    """The first millisecond after `period` (UTC)."""
    import calendar

    year, month = (int(p) for p in month_after(period).split("-"))
    return calendar.timegm((year, month, 1, 0, 0, 0)) * 1000


def signed_cents(num: int) -> int:
    """An exact numerator in cents, half away from zero (a reversal is exactly the negative of its charge)."""
    cents = (abs(num) + CENT_UNITS // 2) // CENT_UNITS
    return cents if num >= 0 else -cents


def allocate_to_total(nums: Mapping[Any, int], total_cents: int) -> dict[Any, int]:
    """Cents per key adding up to `total_cents`: each numerator rounded down, the cents left over one each to
    the largest remainders (ties by key). `total_cents` must lie between the sum of the floors and that sum
    plus the number of keys (any rounding of the exact total does)."""
    floors = {k: n // CENT_UNITS for k, n in nums.items()}
    leftover = total_cents - sum(floors.values())
    if not 0 <= leftover <= len(nums):
        raise ValueError(f"cannot allocate {total_cents} cents over numerators summing to {sum(nums.values())}")
    order = sorted(nums, key=lambda k: (-(nums[k] % CENT_UNITS), str(k)))
    bonus = set(order[:leftover])
    return {k: floors[k] + (1 if k in bonus else 0) for k in nums}


def cents_to_decimal(cents: int) -> Decimal:
    return (Decimal(cents) / 100).quantize(CENT)


@dataclass(frozen=True, slots=True)
class Segment:
    """The ledger's current figures for one job at one rate in one month (v_usage_priced, grouped)."""

    team: str
    cluster: str
    job_id: str
    user: str
    project: str
    original_project: str
    correction_id: str
    cost_centre: str
    generation: str
    pricing_tier: str
    preemptible: bool
    rate_micro: int
    allocated_s: int
    active_s: int
    starved_s: int
    idle_s: int
    dark_s: int
    unpriced_s: int
    charge_num: int


QUANTITIES = ("allocated_s", "active_s", "starved_s", "idle_s", "dark_s", "unpriced_s", "charge_num")
# What an adjustment is kept per: a job's charge to one user, project and cost centre at one price.
ADJUSTMENT_KEY = ("team", "cluster", "job_id", "user", "project", "cost_centre", "generation", "pricing_tier",
                  "preemptible")  # fmt: skip


@dataclass(frozen=True, slots=True)
class StatementLine:
    kind: str
    team: str
    source_period: str
    cluster: str = ""
    job_id: str = ""
    user: str = ""
    project: str = ""
    original_project: str = ""
    correction_id: str = ""
    cost_centre: str = ""
    generation: str = ""
    pricing_tier: str = ""
    preemptible: bool = False
    rate_micro: int = 0
    allocated_s: int = 0
    active_s: int = 0
    starved_s: int = 0
    idle_s: int = 0
    dark_s: int = 0
    unpriced_s: int = 0
    charge_num: int = 0
    cents: int = 0
    cause_kind: str = ""
    cause_ref: str = ""
    note: str = ""

    @property
    def charge(self) -> Decimal:
        return cents_to_decimal(self.cents)

    @property
    def line_id(self) -> str:
        """Deterministic from what the line is (not its amounts): one line per thing per statement."""
        ident = (self.kind, self.team, self.source_period, self.cluster, self.job_id, self.user, self.project,
                 self.original_project, self.correction_id, self.cost_centre, self.generation, self.pricing_tier,
                 self.preemptible, self.rate_micro, self.cause_kind, self.cause_ref)  # fmt: skip
        return hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:24]

    def canonical(self) -> dict[str, Any]:
        """Every field as JSON-safe plain values: what the hash covers (money as its cents)."""
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out["line_id"] = self.line_id
        return out

    def key(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in ADJUSTMENT_KEY)


@dataclass(frozen=True, slots=True)
class Statement:
    period: str
    team: str
    card_version: str
    lines: tuple[StatementLine, ...]
    quality: Tally | None = None  # the team's data-quality tally, frozen with the lines

    def total_cents(self, kind: str | None = None) -> int:
        return sum(line.cents for line in self.lines if kind is None or line.kind == kind)

    def total(self, kind: str | None = None) -> Decimal:
        return cents_to_decimal(self.total_cents(kind))

    def seconds(self, name: str, kind: str = "usage") -> int:
        return sum(getattr(line, name) for line in self.lines if line.kind == kind)

    @property
    def jobs(self) -> int:
        return len({(line.cluster, line.job_id) for line in self.lines if line.kind == "usage"})

    @property
    def coverage_pct(self) -> float:
        alloc = self.seconds("allocated_s")
        return 0.0 if alloc == 0 else round(100 * (alloc - self.seconds("dark_s")) / alloc, 1)

    def canonical(self) -> dict[str, Any]:
        lines = sorted((line.canonical() for line in self.lines), key=lambda c: c["line_id"])
        out: dict[str, Any] = {"period": self.period, "team": self.team, "card_version": self.card_version,
                               "lines": lines}  # fmt: skip
        if self.quality is not None:  # absent, not null, on a statement that froze none: its hash stays
            out["data_quality"] = self.quality.canonical()
        return out

    @property
    def content_hash(self) -> str:
        text = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    @property
    def statement_id(self) -> str:
        return f"{self.period}/{self.team or '-'}/{self.content_hash[:16]}"


@dataclass(frozen=True, slots=True)
class Charge:
    """A credit (negative cents) or a reservation charge that belongs to a month, from an event."""

    kind: str  # credit | reservation
    ref: str  # the appeal or reservation id
    team: str
    source_period: str
    cents: int = 0
    charge_num: int = 0  # a reservation's exact numerator; cents follow from it when given
    cluster: str = ""
    job_id: str = ""
    project: str = ""
    generation: str = ""
    allocated_s: int = 0
    rate_micro: int = 0
    note: str = ""
    # what caused it, when not the kind's own: a priced escalation (issue 41) is held capacity, cause "escalation"
    cause: str = ""

    def line(self) -> StatementLine:
        num = self.charge_num or self.cents * CENT_UNITS
        cents = signed_cents(self.charge_num) if self.charge_num else self.cents
        return StatementLine(
            kind=self.kind, team=self.team, source_period=self.source_period, cluster=self.cluster,
            job_id=self.job_id, project=self.project, generation=self.generation, rate_micro=self.rate_micro,
            allocated_s=self.allocated_s, charge_num=num, cents=cents,
            cause_kind=self.cause or ("appeal" if self.kind == "credit" else "reservation"), cause_ref=self.ref,
            note=self.note,
        )  # fmt: skip


# -- usage ---------------------------------------------------------------------------------------


def usage_lines(period: str, segments: Iterable[Segment]) -> dict[str, list[StatementLine]]:
    """The usage lines of `period` per team, their cents adding up to the report's team lines."""
    by_team: dict[str, list[Segment]] = {}
    for seg in segments:
        by_team.setdefault(seg.team, []).append(seg)
    team_nums = {team: sum(s.charge_num for s in segs) for team, segs in by_team.items()}
    team_cents = {team: int(charge * 100) for team, charge in allocate_cents(team_nums).items()}
    out: dict[str, list[StatementLine]] = {}
    for team, segs in by_team.items():
        lines = [_usage_line(period, seg) for seg in segs]
        if len({line.line_id for line in lines}) != len(lines):
            raise ValueError(f"{period} {team}: two usage segments with the same identity")
        cents = allocate_to_total({line.line_id: line.charge_num for line in lines}, team_cents[team])
        out[team] = [replace(line, cents=cents[line.line_id]) for line in lines]
    return out


def _usage_line(period: str, s: Segment) -> StatementLine:
    return StatementLine(
        kind="usage", team=s.team, source_period=period, cluster=s.cluster, job_id=s.job_id, user=s.user,
        project=s.project, original_project=s.original_project, correction_id=s.correction_id,
        cost_centre=s.cost_centre, generation=s.generation, pricing_tier=s.pricing_tier, preemptible=s.preemptible,
        rate_micro=s.rate_micro, allocated_s=s.allocated_s, active_s=s.active_s, starved_s=s.starved_s,
        idle_s=s.idle_s, dark_s=s.dark_s, unpriced_s=s.unpriced_s, charge_num=s.charge_num,
    )  # fmt: skip


# -- adjustments ---------------------------------------------------------------------------------


@dataclass
class _Sums:
    values: dict[str, int] = field(default_factory=lambda: dict.fromkeys(QUANTITIES, 0))

    def add(self, item: Any, sign: int = 1) -> None:
        for name in QUANTITIES:
            self.values[name] += sign * getattr(item, name)


def pending_adjustments(
    source_period: str,
    frozen: Sequence[StatementLine],
    posted: Sequence[StatementLine],  # oldest statement first
    now: Sequence[Segment],
    card_version: str,
) -> list[StatementLine]:
    """What closed month `source_period` owes or is owed now: the ledger's figures (`now`) minus the frozen
    usage lines minus the adjustments already posted for it in later closed statements. One line per key
    with a non-zero difference, its cause named (see the module's docstring)."""
    sums: dict[tuple[Any, ...], _Sums] = {}

    def at(key: tuple[Any, ...]) -> _Sums:
        found = sums.get(key)
        if found is None:
            found = sums[key] = _Sums()
        return found

    # The correction each job's figures already reflect: the frozen one, then any a posted adjustment named.
    accounted: dict[tuple[str, str], str] = {}
    for line in frozen:
        if line.kind == "usage":
            at(line.key()).add(line, -1)
            accounted[(line.cluster, line.job_id)] = line.correction_id
    for line in posted:  # in the order they were posted
        if line.kind == "adjustment" and line.source_period == source_period:
            at(line.key()).add(line, -1)
            if line.cause_kind == "correction":
                accounted[(line.cluster, line.job_id)] = line.cause_ref
    now_correction: dict[tuple[str, str], str] = {}
    for seg in now:
        at(tuple(getattr(seg, name) for name in ADJUSTMENT_KEY)).add(seg)
        now_correction[(seg.cluster, seg.job_id)] = seg.correction_id  # one per job (the latest correction)
    out = []
    changed = [(key, delta) for key, delta in sums.items() if any(delta.values.values())]
    for key, delta in sorted(changed, key=lambda kv: [str(k) for k in kv[0]]):
        d: dict[str, Any] = delta.values
        fields_: dict[str, Any] = dict(zip(ADJUSTMENT_KEY, key, strict=True))
        job = (fields_["cluster"], fields_["job_id"])
        corrected = now_correction.get(job, "")
        if job in accounted and corrected != accounted[job]:
            cause, ref = "correction", corrected
        elif d["allocated_s"] != 0:
            cause, ref = "late-data", ""
        else:
            cause, ref = "rate-card", card_version
        out.append(StatementLine(kind="adjustment", source_period=source_period, **fields_, **d,
                                 cents=signed_cents(d["charge_num"]), cause_kind=cause, cause_ref=ref))  # fmt: skip
    return out


# -- a month's statements ------------------------------------------------------------------------


def build_statements(
    period: str,
    segments: Iterable[Segment],
    adjustments: Iterable[StatementLine],
    charges: Iterable[Charge],
    card_version: str,
    quality: Mapping[str, Tally] | None = None,
) -> tuple[Statement, ...]:
    """Every team's statement of `period`: its usage, plus the adjustments and charges routed to it (the
    caller passes only those). A team with only adjustments or charges gets a statement too. With `quality`
    (each team's data-quality tally), every statement carries its team's (zero for a team with no jobs)."""
    lines = usage_lines(period, segments)
    for adj in adjustments:
        lines.setdefault(adj.team, []).append(adj)
    for charge in charges:
        lines.setdefault(charge.team, []).append(charge.line())
    for team in quality or {}:
        lines.setdefault(team, [])  # the figure of every job is frozen somewhere
    out = []
    for team in sorted(lines):
        ids = [line.line_id for line in lines[team]]
        if len(set(ids)) != len(ids):
            raise ValueError(f"statement {period} {team}: two lines with the same identity")
        tally = None if quality is None else quality.get(team, Tally())
        out.append(Statement(period, team, card_version, tuple(sorted(lines[team], key=lambda x: x.line_id)),
                             tally))  # fmt: skip
    return tuple(out)


def close_id(period: str, statements: Sequence[Statement]) -> str:
    text = period + "".join(sorted(s.content_hash for s in statements))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def check_closable(period: str, now_ms: int, closed: Iterable[str], with_usage: Iterable[str]) -> None:
    """Refuse, in one line, to close a month twice, before it has ended, or while an earlier month with usage
    is still open (months close in order, so every later change has one month to go to)."""
    closed = set(closed)
    if period in closed:
        raise ConfigError(f"period {period} is already closed; a change to it becomes an adjustment in "
                          f"{month_after(period)} or later")  # fmt: skip
    if now_ms < period_end_ms(period):
        raise ConfigError(f"period {period} has not ended yet (it ends at {month_after(period)}-01T00:00Z)")
    earlier = sorted(p for p in with_usage if p < period and p not in closed)
    if earlier:
        raise ConfigError(f"close {earlier[0]} first: months close in order (open before {period}: "
                          f"{', '.join(earlier)})")  # fmt: skip
