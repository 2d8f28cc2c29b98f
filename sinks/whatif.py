"""What if (issue 43): a stored month beside the same month under a proposed policy and rate card.

This module reads the month from the warehouse (`load_month`), prices it under a rate card (`prices`) and puts
the actual month beside a replayed one (`compare`). The replay itself (the idle state machine over the month's
job-minutes) is `processors.whatif`, handed in by the command: the components do not import each other.

Charges are the warehouse's own SQL, never restated here. Under a proposed card the month is read through
`v_usage_priced`'s own text (`sinks/views`) with a `v_rate_card` of the proposed rows in front of it, bound as
parameters: the live view's arithmetic (rate in force per day, MIG share, preemptible rate, corrected project) over
the proposed rates, in one read. Everything here reads: the fleet page runs it as the read-only analyst, whose
writes the engine refuses; nothing is written to the ledger. Lines are cent-allocated as `v_chargeback` does
(`ratecard.allocate_cents`).
"""

from __future__ import annotations

import bisect
import datetime as dt
import re
import tomllib
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol

from base.errors import ConfigError
from base.processor_settings import IdlePolicy
from base.settings import Settings
from schemas.governance_reservations import MINUTE_MS, SERVICE_ACTOR, Reservation, due, idle_minutes_at
from schemas.governance_reservations import fold as fold_reservations
from schemas.policy import Policy, load_policy
from sinks.db import check_identifier
from sinks.governance import appeal_events, reservation_events
from sinks.periods import check_period
from sinks.ratecard import (
    DEFAULT_CARD,
    RATE_CARD_COLUMNS,
    RateCard,
    allocate_cents,
    charge_for_seconds,
    gpu_hours,
    load_card,
    parse_card,
    rate_card_rows,
)
from sinks.reservations import active_minutes
from sinks.view_files import load_views

BY_CHOICES = ("team", "project", "generation")
IDLE_KINDS = ("IDLE_WARNING", "RECLAIM_NOTICE")  # the alerts compared (a resolution is not an event people act on)
LOOKBACK_MS = 31 * 24 * 3600 * 1000  # a job running into the month is replayed from at most this far back
IDENTITY_COLUMNS = ("user", "project", "team", "cost_centre", "preemptible", "pricing_tier")  # of a job's minutes
RUN_COLUMNS = ("minute_start_ms", "minutes", "active_s", "starved_s", "idle_s", "allocated_s", "generation",
               "device_count")  # a run of alike job-minutes: its first minute, how many, what each holds  # fmt: skip
FLAG_COLUMNS = ("scheduler", "partition", "interactive", "checkpointable", "gang_size")
PRICED_COLUMNS = ("cluster", "job_id", "day", "team", "project", "generation", "allocated_s", "idle_s",
                  "charge_num", "idle_charge_num", "rate_micro", "start_ms")  # fmt: skip
ASSUMPTIONS = (
    "identity, devices and time of every job are the month's own: a job reclaimed by the proposal keeps its stored "
    "minutes (its later work does not move, nobody else takes its GPUs)",
    "released GPU-hours are a reclaimed job's allocated time from its first reclaim to its end, priced at the "
    "proposed rates; charges are on allocation as it happened (releases are shown beside, not deducted)",
    "a job running into the month is replayed from at most 31 days before it; appeals keep the decisions made",
    "queued jobs: each team's jobs admitted in the month's own start order against its quota plus borrowing "
    "limit per generation; a job that would not fit waits for the earliest ends (no preemption, no backfill)",
    "reservations: under other idle limits, an idle warning or early release falls at the first moment the "
    "reservation service's own rule could take it (its passes come every few seconds and see a minute once it is "
    "stored, so the live step falls a little later); under the limits in force, the steps the service took",
)
Key = tuple[str, str]  # (cluster, job_id)


def month_bounds(period: str) -> tuple[int, int]:
    """[start, end) of the month in epoch ms (UTC)."""
    year, month = map(int, check_period(period).split("-"))
    start = dt.datetime(year, month, 1, tzinfo=dt.UTC)
    end = dt.datetime(year + month // 12, month % 12 + 1, 1, tzinfo=dt.UTC)
    return int(start.timestamp() * 1000), int(end.timestamp() * 1000)


@dataclass(frozen=True, slots=True)
class Month:
    """A month as the warehouse holds it: each job's job-minutes as runs (`RUN_COLUMNS`), its identity and flags,
    the month's idle alerts and appeal steps."""

    period: str
    start_ms: int
    end_ms: int
    minutes: dict[Key, list[dict[str, Any]]]  # runs, each a first minute and how many alike follow it
    jobs: dict[Key, dict[str, Any]]  # cluster, job_id, `IDENTITY_COLUMNS` (first minute's), `FLAG_COLUMNS`
    alerts: list[dict[str, Any]]
    appeals: list[dict[str, Any]]
    # per job: (first minute, last minute, most devices) over every stored minute
    spans: dict[Key, tuple[int, int, int]] = field(default_factory=dict)


def load_month(client: Any, period: str, run_classes: Sequence[int] | None = None, min_streak: int = 1) -> Month:
    """The month's jobs (any job-minute in it), their job-minutes from `LOOKBACK_MS` before it, their identity (the
    first minute's) and flags from the start event (`JobInfo` is snapshotted there), the month's idle alerts and
    every appeal step.

    `run_classes` (the replay's `processors.whatif.run_classes()`: a class code per sign pattern of active, starved
    and idle seconds, the classifier's own answers) makes the warehouse hand the minutes over as runs: contiguous
    minutes of one class, allocated seconds, generation and device count, each one row (`RUN_COLUMNS`: its first
    minute, `minutes`, and the seconds signs of the first pattern of its class in the table, which is all the
    classifier reads), which `idle.step_run` steps as `step` would each minute; and only for the jobs with
    `min_streak` or more contiguous idle minutes somewhere (`shortest_warning`: fewer can never be warned, so the
    state machine emits nothing for them; 0: every job). One pass over the month in the warehouse: per job, its
    minutes as two arrays (start, and class, generation, devices and allocated seconds packed in one integer), run
    starts where either changes; `spans` and identity cover every job. Without `run_classes` every stored minute
    is a run of one with its own seconds, every job (for tests: no packing, no arrays)."""
    start, end = month_bounds(period)
    params: dict[str, Any] = {"start": start, "end": end, "from": start - LOOKBACK_MS}
    firsts = ", ".join(f"argMin({c}, minute_start_ms)" for c in IDENTITY_COLUMNS)
    minutes: dict[Key, list[dict[str, Any]]] = {}
    jobs: dict[Key, dict[str, Any]] = {}
    spans: dict[Key, tuple[int, int, int]] = {}
    window = "FROM " + minutes_between(params, "from", "end")
    # jobs with a minute in the month; rows before it only for them (a HAVING, not an IN: an IN over (cluster,
    # job_id) costs more than reading the lookback's rows)
    month_jobs = "GROUP BY cluster, job_id HAVING max(minute_start_ms) >= {start:Int64}"
    if run_classes is None:
        _minutes_one_by_one(client, params, f"{window} {month_jobs}", firsts, (jobs, spans, minutes))
    else:
        _minutes_as_runs(client, period, params, (window, month_jobs, firsts), run_classes, min_streak,
                         (jobs, spans, minutes))  # fmt: skip
    _flags(client, params, jobs)
    return Month(period, start, end, minutes, jobs, _idle_alerts(client, params), appeal_events(client), spans)


def minutes_between(params: dict[str, Any], start: str, end: str) -> str:
    """`job_minutes` as `FINAL` reads it in [params[start], params[end]), `day` included, a subquery: one branch per
    calendar month, each `FINAL` over its own partition (`_partition_id`, parameters added to `params`).

    The table is `PARTITION BY toYYYYMM(day)` (migration 001; `day` the date of `minute_start_ms`, a column of the
    key), so rows that `FINAL` folds together never lie in two partitions and each month can be folded alone. Left
    to the engine, `FINAL` over a table whose partition column is not in its sorting key reads every partition
    (`defer_partition_pruning_after_final`) and merges them into one stream: a month with the month before it
    stored cost 3x its server CPU, and every further month stored would add its own. The analyst may not change
    settings (`do_not_merge_across_partitions_select_final`), so the query says it itself."""
    first = dt.datetime.fromtimestamp(params[start] / 1000, dt.UTC).date().replace(day=1)
    branches: list[str] = []
    while int(dt.datetime(first.year, first.month, 1, tzinfo=dt.UTC).timestamp() * 1000) < params[end]:
        name = f"{start}_{end}_partition_{len(branches)}"
        params[name] = f"{first.year:04d}{first.month:02d}"
        branches.append(f"SELECT *, day FROM job_minutes FINAL WHERE _partition_id = {{{name}:String}} "
                        f"AND minute_start_ms >= {{{start}:Int64}} AND minute_start_ms < {{{end}:Int64}}")  # fmt: skip
        first = (first + dt.timedelta(days=32)).replace(day=1)
    return f"({' UNION ALL '.join(branches)})" if branches else "(SELECT *, day FROM job_minutes WHERE false)"


Found = tuple[dict[Key, dict[str, Any]], dict[Key, tuple[int, int, int]], dict[Key, list[dict[str, Any]]]]


def _minutes_one_by_one(client: Any, params: dict[str, Any], source: str, firsts: str, found: Found) -> None:
    """`load_month` without run classes: every stored minute a run of one with its own seconds, every job;
    `source`: the month's rows grouped by job; `found`: jobs, spans, minutes to fill."""
    jobs, spans, minutes = found
    cols = ", ".join(c for c in RUN_COLUMNS if c != "minutes")
    for row in client.query(
        f"SELECT cluster, job_id, {firsts}, min(minute_start_ms), max(minute_start_ms), max(device_count), "
        f"arraySort(m -> m.1, groupArray(({cols}))) {source}",
        parameters=params,
    ).result_rows:
        key = (str(row[0]), str(row[1]))
        jobs[key] = {"cluster": key[0], "job_id": key[1], **dict(zip(IDENTITY_COLUMNS, row[2:8], strict=True))}
        spans[key] = (int(row[8]), int(row[9]), int(row[10]))
        minutes[key] = [{**dict(zip((c for c in RUN_COLUMNS if c != "minutes"), m, strict=True)), "minutes": 1}
                        for m in row[11]]  # fmt: skip


def _minutes_as_runs(client: Any, period: str, params: dict[str, Any], parts: tuple[str, str, str],
                     run_classes: Sequence[int], min_streak: int, found: Found) -> None:
    """`load_month` with run classes: one pass of the warehouse hands each job's minutes over as runs (see there);
    `parts`: the month's rows, its jobs' grouping, their identity columns; `found`: jobs, spans, minutes to fill."""
    window, month_jobs, firsts = parts
    jobs, spans, minutes = found
    if len(run_classes) != 8:
        raise ConfigError("run_classes names a class for each of the 8 sign patterns")
    codes = [int(c) for c in run_classes]
    if min(codes) < 0 or max(codes) > 3:
        raise ConfigError("run_classes: codes 0-3 (two bits of the packed key)")
    gens = [str(r[0]) for r in client.query(f"SELECT DISTINCT generation {window}", parameters=params).result_rows]
    if len(gens) > 255:
        raise ConfigError(f"{len(gens)} generations in {period}: the replay packs at most 255")
    # the packed key: class code (2 bits) | generation's index (8) | devices (22) | allocated seconds (32)
    params.update(classes=codes, gens=gens, idle=codes[1], streak=min_streak)  # signs 001: idle seconds alone
    packed = (
        "toUInt64({classes:Array(UInt8)}[1 + (active_s > 0) * 4 + (starved_s > 0) * 2 + (idle_s > 0)]) "
        "+ bitShiftLeft(toUInt64(indexOf({gens:Array(String)}, generation)), 2) "
        "+ bitShiftLeft(toUInt64(least(device_count, 4194303)), 10) + bitShiftLeft(toUInt64(allocated_s), 32)"
    )
    per_job = (
        f"SELECT cluster, job_id, {firsts}, min(minute_start_ms) AS first, max(minute_start_ms) AS last, "
        f"max(device_count) AS devices, groupArray(minute_start_ms) AS ms0, groupArray({packed}) AS k0 "
        f"{window} {month_jobs}"
    )
    # sorted by minute; idle streaks: breaks in the idle minutes' sequence; runs: a change of minute or key
    sql = (
        "SELECT * EXCEPT (ms0, k0, p, ms, k, im, br, idx), if(longest >= {streak:Int64}, arrayMap(i -> ms[i], "
        "idx), []), if(longest >= {streak:Int64}, arrayMap(j -> if(j < length(idx), idx[j + 1], length(ms) + 1) "
        "- idx[j], arrayEnumerate(idx)), []), if(longest >= {streak:Int64}, arrayMap(i -> k[i], idx), []) FROM ("
        "SELECT *, arrayFilter((x, c) -> bitAnd(c, 3) = {idle:UInt8}, ms, k) AS im, arrayFilter((i, d) -> "
        "d != 60000, arrayEnumerate(im), arrayDifference(im)) AS br, arrayMax(arrayDifference(arrayPushBack(br, "
        "length(im) + 1))) AS longest, arrayFilter((i, dm, dk) -> dm != 60000 OR dk != 0, arrayEnumerate(ms), "
        "arrayDifference(ms), arrayDifference(k)) AS idx FROM (SELECT *, arraySort((i, x) -> x, arrayEnumerate("
        f"ms0), ms0) AS p, arrayMap(i -> ms0[i], p) AS ms, arrayMap(i -> k0[i], p) AS k FROM ({per_job})))"
    )
    signs = {}  # per class code, the first sign pattern of it in the table: (active_s, starved_s, idle_s)
    for bits in reversed(range(8)):
        signs[codes[bits]] = ((bits >> 2) & 1, (bits >> 1) & 1, bits & 1)
    for row in client.query(sql, parameters=params).result_rows:
        key = (str(row[0]), str(row[1]))
        jobs[key] = {"cluster": key[0], "job_id": key[1], **dict(zip(IDENTITY_COLUMNS, row[2:8], strict=True))}
        spans[key] = (int(row[8]), int(row[9]), int(row[10]))
        if int(row[10]) > 4194303:
            raise ConfigError(f"job {key[1]} holds {row[10]} devices: more than the replay packs")
        if row[12]:
            minutes[key] = [_run(ms, n, k, signs, gens) for ms, n, k in zip(row[12], row[13], row[14], strict=True)]


def _flags(client: Any, params: dict[str, Any], jobs: dict[Key, dict[str, Any]]) -> None:
    """Each month job's flags from its first STARTED event (else its first event): the job stage's
    `JobInfo.from_event`."""
    in_month = f"SELECT DISTINCT cluster, job_id FROM {minutes_between(params, 'start', 'end')}"
    picks = ", ".join(f"argMin({c}, (event_type != 'STARTED', ts_ms)) AS {c}" for c in FLAG_COLUMNS)
    for row in client.query(
        f"SELECT cluster, job_id, {picks} FROM job_events FINAL WHERE (cluster, job_id) IN ({in_month}) "
        "GROUP BY cluster, job_id",
        parameters=params,
    ).result_rows:
        key = (row[0], row[1])
        jobs.setdefault(key, {"cluster": key[0], "job_id": key[1]}).update(zip(FLAG_COLUMNS, row[2:], strict=True))


def _idle_alerts(client: Any, params: dict[str, Any]) -> list[dict[str, Any]]:
    """The month's idle alerts as stored."""
    return [
        dict(
            zip(
                (
                    "alert_id",
                    "kind",
                    "ts_ms",
                    "cluster",
                    "job_id",
                    "action",
                    "action_at_ms",
                    "idle_minutes",
                    "cost_so_far",
                ),
                row,
                strict=True,
            )
        )
        for row in client.query(
            "SELECT alert_id, kind, ts_ms, cluster, job_id, action, action_at_ms, idle_minutes, cost_so_far "
            "FROM alerts FINAL WHERE ts_ms >= {start:Int64} AND ts_ms < {end:Int64} AND kind IN {kinds:Array(String)}",
            parameters={**params, "kinds": list(IDLE_KINDS)},
        ).result_rows
    ]


def _run(
    start_ms: int, n: int, key: int, signs: Mapping[int, tuple[int, int, int]], gens: Sequence[str]
) -> dict[str, Any]:
    """A run's row (`RUN_COLUMNS`) from its first minute, length and packed key (see `load_month`)."""
    active, starved, idle = signs[key & 3]
    index = (key >> 2) & 255
    return {"minute_start_ms": start_ms, "minutes": n, "active_s": active, "starved_s": starved, "idle_s": idle,
            "allocated_s": key >> 32, "generation": gens[index - 1] if index else "",
            "device_count": (key >> 10) & 4194303}  # fmt: skip


def shortest_warning(idle: IdlePolicy) -> int:
    """The fewest contiguous idle minutes that can bring a warning under `idle`: the least threshold it names (the
    idle state machine's `idle_after_min` picks one of them per job, and warns only when the streak reaches it;
    nothing else it emits comes before a warning). At least 1: a job with no idle minute is never warned.
    tests/unit/test_idle_runs.py holds the machine to it."""
    named = (idle.idle_after_min_interactive, idle.idle_after_min_batch, *idle.idle_after_min_by_partition.values(),
             *idle.idle_after_min_by_project.values())  # fmt: skip
    return max(1, min(named))


# -- prices -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PricedDay:
    """One job's day as `v_usage_priced` prices it (numerators: seconds x micro-dollars per GPU-hour)."""

    team: str
    project: str
    generation: str
    allocated_s: int
    idle_s: int
    charge_num: int
    idle_charge_num: int
    rate_micro: int
    start_ms: int


Priced = dict[Key, dict[dt.date, PricedDay]]


def _priced(client: Any, database: str, period: str, priced: str | None = None,
            params: Mapping[str, Any] | None = None) -> Priced:  # fmt: skip
    """The month's rows of `v_usage_priced` in `database`, or of `priced` (a query: `WITH ... SELECT ...` of the
    view's own text, its parameters `params`) read in the client's database."""
    source = f"{check_identifier(database)}.v_usage_priced" if priced is None else f"({priced})"
    out: Priced = defaultdict(dict)
    rows = client.query(
        f"SELECT cluster, job_id, day, any(team), any(project), any(generation), sum(allocated_s), sum(idle_s), "
        f"sum(charge_num), sum(idle_charge_num), max(rate_micro), min(job_start_ms) "
        f"FROM {source} WHERE period = {{period:String}} GROUP BY cluster, job_id, day",
        parameters={**(params or {}), "period": period},
    ).result_rows
    for row in rows:
        rec = dict(zip(PRICED_COLUMNS, row, strict=True))
        out[(rec["cluster"], rec["job_id"])][rec["day"]] = PricedDay(
            str(rec["team"]), str(rec["project"]), str(rec["generation"]), int(rec["allocated_s"]),
            int(rec["idle_s"]), int(rec["charge_num"]), int(rec["idle_charge_num"]), int(rec["rate_micro"]),
            int(rec["start_ms"] or 0))  # fmt: skip
    return dict(out)


def actual_prices(client: Any, database: str, period: str) -> Priced:
    """The month as the ledger prices it now (the card loaded in the warehouse)."""
    return _priced(client, database, period)


# The proposal's card in place of the warehouse's: `v_usage_priced` reads the card only through `v_rate_card` (the
# latest load of `rate_card`), and a query's own `WITH v_rate_card AS (...)` is what that name means inside it. The
# rows are one load of one parsed card (a key once), which is all `v_rate_card` would select of them.
_PROPOSED_CARD = (
    "WITH v_rate_card AS (SELECT c.1 AS generation, c.2 AS pricing_tier, c.3 AS preemptible, c.4 AS effective_from, "
    "c.5 AS rate_micro_per_gpu_hour FROM (SELECT arrayJoin(arrayZip({card_generation:Array(String)}, "
    "{card_tier:Array(String)}, {card_preemptible:Array(Bool)}, {card_from:Array(Date)}, "
    "{card_rate:Array(UInt64)})) AS c)) "
)


def proposed_card(path: Path | None, proposal: Policy) -> RateCard:
    """The rate card under a proposal: the card's rates with the proposal's preemptible discount when it states one
    (in force, `load_card` refuses a card and a policy that disagree; a proposal is exactly such a change)."""
    if proposal.preemptible is None:
        return load_card(path)
    target = path or DEFAULT_CARD
    try:
        with target.open("rb") as fh:
            data = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"rate card {target}: {exc}") from exc
    data.pop("preemptible_discount", None)
    return parse_card(data, proposal.preemptible_discount)


def proposed_prices(client: Any, database: str, period: str, card_rows: Sequence[Sequence[Any]]) -> Priced:
    """The month priced by the live view's own text over the proposed card's rows (`ratecard.rate_card_rows`):
    `v_usage_priced`'s statement as `sinks/views` defines it, in one read with the card bound as parameters
    (`_PROPOSED_CARD`). A read only: the read-only analyst may run it, and nothing is created or written."""
    columns = dict(zip(RATE_CARD_COLUMNS, zip(*card_rows, strict=True), strict=False)) if card_rows else {}
    keys = list(zip(*(columns.get(c, ()) for c in RATE_CARD_COLUMNS[:4]), strict=True))
    if len(set(keys)) != len(keys):
        raise ConfigError("the proposed rate card names a rate twice")
    view = next(v for v in load_views() if v.name == "v_usage_priced")
    head = _VIEW_HEAD.match(view.statement)
    if head is None:
        raise ConfigError(f"{view.path}: not the CREATE OR REPLACE VIEW v_usage_priced AS statement it should be")
    body = view.statement[head.end() :]
    names = {"card_generation": "generation", "card_tier": "pricing_tier", "card_preemptible": "preemptible",
             "card_from": "effective_from", "card_rate": "rate_micro_per_gpu_hour"}  # fmt: skip
    params = {name: list(columns.get(column, ())) for name, column in names.items()}
    return _priced(client, database, period, f"{_PROPOSED_CARD}SELECT * FROM ({body})", params)


_VIEW_HEAD = re.compile(r"^\s*CREATE OR REPLACE VIEW v_usage_priced AS\b")


# -- quota ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueuedJob:
    cluster: str
    job_id: str
    team: str
    generation: str
    gpus: int
    start_ms: int
    wait_ms: int


def quota_limits(policy: Policy) -> dict[tuple[str, str], int]:
    """GPUs each team may hold of each generation: quota + borrowing limit, as `policy render` gives Slurm's
    GrpTRES and Kueue's nominal quota + borrowingLimit. Pairs with none are left out (not estimated)."""
    out = {}
    for team in policy.teams:
        for gen in policy.generations:
            limit = team.quota.get(gen, 0) + team.borrowing_limit.get(gen, 0)
            if limit > 0:
                out[(team.name, gen)] = limit
    return out


def queued_behind_quota(
    jobs: Iterable[tuple[Key, str, str, int, int, int]], limits: Mapping[tuple[str, str], int]
) -> list[QueuedJob]:
    """Jobs that would have waited for their team's quota: `jobs` are (key, team, generation, gpus, start_ms,
    end_ms) in any order, `limits` the GPUs a team may hold of a generation (quota + borrowing limit; a pair not
    named is unlimited). Admitted in the month's own start order (ties by key); a job that does not fit starts
    when enough of its team's earlier jobs have ended, and keeps its duration."""
    running: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)  # (end, gpus) admitted
    out = []
    for key, team, gen, gpus, start, end in sorted(jobs, key=lambda j: (j[4], j[0])):
        limit = limits.get((team, gen))
        if limit is None or gpus <= 0:
            continue
        held = running[(team, gen)]
        at = start
        while True:
            held[:] = [(e, g) for e, g in held if e > at]
            if sum(g for _, g in held) + gpus <= limit or not held:
                break
            at = min(e for e, _ in held)  # the next end frees GPUs
        held.append((at + (end - start), gpus))
        if at > start:
            out.append(QueuedJob(key[0], key[1], team, gen, gpus, start, at - start))
    return out


# -- the comparison ---------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Line:
    jobs: set[Key] = field(default_factory=set)
    actual_num: int = 0
    whatif_num: int = 0
    warnings_actual: int = 0
    warnings_whatif: int = 0
    reclaims_actual: int = 0
    reclaims_whatif: int = 0
    released_s: int = 0
    released_idle_s: int = 0
    released: list[tuple[int, int]] = field(default_factory=list)  # (seconds, micro-dollars/h)
    released_idle: list[tuple[int, int]] = field(default_factory=list)
    queued_jobs: int = 0
    queued_wait_ms: int = 0


LINE_COLUMNS = ("line", "jobs", "charge_actual", "charge_whatif", "charge_change", "warnings_actual",
                "warnings_whatif", "reclaims_actual", "reclaims_whatif", "released_gpu_h", "released_idle_gpu_h",
                "released_cost", "released_idle_cost", "queued_jobs", "queued_wait_h")  # fmt: skip
EVENT_COLUMNS = ("scenario", "kind", "time_utc", "cluster", "job_id", "team", "project", "generation", "action",
                 "idle_minutes")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Comparison:
    period: str
    by: str
    lines: list[dict[str, Any]]
    events: list[dict[str, Any]]
    queued: list[QueuedJob]
    assumptions: tuple[str, ...] = ASSUMPTIONS
    reservations: list[dict[str, Any]] = field(default_factory=list)  # `reservations_changed`


def _utc(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M")


def _who(key: Key, month: Month, *priced: Priced) -> tuple[str, str, str]:
    """(team, project, generation) of a job: its priced rows (the corrected project), else its job-minutes."""
    for p in priced:
        days = p.get(key)
        if days:
            first = days[min(days)]
            return first.team, first.project, first.generation
    job = month.jobs.get(key, {})
    runs = month.minutes.get(key) or [{}]
    return str(job.get("team", "")), str(job.get("project", "")), str(runs[0].get("generation", ""))


def compare(
    month: Month,
    by: str,
    actual: Priced,
    whatif: Priced,
    whatif_alerts: Sequence[Mapping[str, Any]],
    whatif_actions: Sequence[Mapping[str, Any]],
    limits: Mapping[tuple[str, str], int] | None = None,
    released: Mapping[Key, Mapping[dt.date, tuple[int, int]]] | None = None,
) -> Comparison:
    """Lines by `by` (team, project or generation): the actual month beside the replayed one. `released`: per
    reclaimed job and day, the allocated and idle seconds from its first reclaim (`released_after`)."""
    if by not in BY_CHOICES:
        raise ConfigError(f"--by must be one of {', '.join(BY_CHOICES)}, got {by!r}")
    pick = BY_CHOICES.index(by)
    lines: dict[str, _Line] = defaultdict(_Line)

    def line_of(key: Key) -> _Line:
        return lines[_who(key, month, whatif, actual)[pick]]

    for source, attr in ((actual, "actual_num"), (whatif, "whatif_num")):
        for key, days in source.items():
            ln = line_of(key)
            ln.jobs.add(key)
            setattr(ln, attr, getattr(ln, attr) + sum(d.charge_num for d in days.values()))
    events: list[dict[str, Any]] = []
    in_month = [a for a in whatif_alerts if month.start_ms <= int(a["ts_ms"]) < month.end_ms]
    for scenario, alerts in (("actual", month.alerts), ("whatif", in_month)):
        for a in sorted(alerts, key=lambda a: (int(a["ts_ms"]), a["cluster"], a["job_id"], a["kind"])):
            if a["kind"] not in IDLE_KINDS:
                continue
            key = (str(a["cluster"]), str(a["job_id"]))
            ln = line_of(key)
            warned = a["kind"] == "IDLE_WARNING"
            name = f"{'warnings' if warned else 'reclaims'}_{scenario}"
            setattr(ln, name, getattr(ln, name) + 1)
            team, project, gen = _who(key, month, whatif, actual)
            events.append({"scenario": scenario, "kind": a["kind"], "time_utc": _utc(int(a["ts_ms"])),
                           "cluster": key[0], "job_id": key[1], "team": team, "project": project,
                           "generation": gen, "action": a.get("action") or "",
                           "idle_minutes": a.get("idle_minutes")})  # fmt: skip
    for key, by_day in (released or {}).items():
        ln = line_of(key)
        days = whatif.get(key, {})
        for day, (alloc_s, idle_s) in sorted(by_day.items()):
            rate = days[day].rate_micro if day in days else 0
            ln.released_s += alloc_s
            ln.released_idle_s += idle_s
            ln.released.append((alloc_s, rate))
            ln.released_idle.append((idle_s, rate))
    queued = queued_behind_quota(_quota_jobs(month, whatif), limits) if limits else []
    for q in queued:
        ln = line_of((q.cluster, q.job_id))
        ln.queued_jobs += 1
        ln.queued_wait_ms += q.wait_ms
    names = sorted(lines)
    actual_cents = allocate_cents({n: lines[n].actual_num for n in names})
    whatif_cents = allocate_cents({n: lines[n].whatif_num for n in names})
    rows = [_row(n, lines[n], actual_cents[n], whatif_cents[n]) for n in names]
    total = _Line()
    for ln in lines.values():
        total.jobs |= ln.jobs
        for f in ("warnings_actual", "warnings_whatif", "reclaims_actual", "reclaims_whatif", "released_s",
                  "released_idle_s", "queued_jobs", "queued_wait_ms"):  # fmt: skip
            setattr(total, f, getattr(total, f) + getattr(ln, f))
        total.released += ln.released
        total.released_idle += ln.released_idle
    rows.append(_row("TOTAL", total, sum(actual_cents.values(), Decimal(0)), sum(whatif_cents.values(), Decimal(0))))
    return Comparison(month.period, by, rows, events, queued)


def _quota_jobs(month: Month, priced: Priced) -> Iterator[tuple[Key, str, str, int, int, int]]:
    """(key, team, generation, GPUs, start, end) of each job with minutes in the month, from its job-minutes."""
    for key, (first, last, gpus) in month.spans.items():
        team, _, gen = _who(key, month, priced)
        yield key, team, gen, gpus, first, last + 60_000


def first_reclaims(month: Month, actions: Iterable[Mapping[str, Any]]) -> dict[Key, int]:
    """Per job, the time of its first replayed reclaim inside the month."""
    out: dict[Key, int] = {}
    for act in actions:
        key = (str(act["cluster"]), str(act["job_id"]))
        ts = int(act["ts_ms"])
        if month.start_ms <= ts < month.end_ms:
            out[key] = min(ts, out.get(key, ts))
    return out


def released_after(client: Any, month: Month, at: Mapping[Key, int]) -> dict[Key, dict[dt.date, tuple[int, int]]]:
    """Per job of `at` and day, its stored allocated and idle seconds from `at[job]` to the month's end (every
    minute, whatever the replay was fed)."""
    if not at:
        return {}
    out: dict[Key, dict[dt.date, tuple[int, int]]] = defaultdict(dict)
    params = {"first": min(at.values()), "end": month.end_ms, "clusters": [k[0] for k in at],
              "jobs": [k[1] for k in at], "at": list(at.values())}  # fmt: skip
    # no IN on the key's first columns: the reclaimed jobs are spread over the table (a fifth of the jobs at 10,000
    # GPUs touch nearly every granule), so the primary key skips little and the set costs more than it saves
    rows = client.query(
        "SELECT m.cluster, m.job_id, m.day, sum(m.allocated_s), sum(m.idle_s) "
        f"FROM {minutes_between(params, 'first', 'end')} AS m "
        "INNER JOIN (SELECT r.1 AS cluster, r.2 AS job_id, r.3 AS at FROM (SELECT arrayJoin(arrayZip("
        "{clusters:Array(String)}, {jobs:Array(String)}, {at:Array(Int64)})) AS r)) AS r "
        "ON m.cluster = r.cluster AND m.job_id = r.job_id "
        "WHERE m.minute_start_ms >= r.at GROUP BY m.cluster, m.job_id, m.day",
        parameters=params,
    ).result_rows
    for cluster, job_id, day, alloc_s, idle_s in rows:
        out[(str(cluster), str(job_id))][day] = (int(alloc_s), int(idle_s))
    return dict(out)


def _row(name: str, ln: _Line, actual: Decimal, whatif: Decimal) -> dict[str, Any]:
    return {
        "line": name,
        "jobs": len(ln.jobs),
        "charge_actual": actual,
        "charge_whatif": whatif,
        "charge_change": whatif - actual,
        "warnings_actual": ln.warnings_actual,
        "warnings_whatif": ln.warnings_whatif,
        "reclaims_actual": ln.reclaims_actual,
        "reclaims_whatif": ln.reclaims_whatif,
        "released_gpu_h": gpu_hours(ln.released_s),
        "released_idle_gpu_h": gpu_hours(ln.released_idle_s),
        "released_cost": charge_for_seconds(ln.released),
        "released_idle_cost": charge_for_seconds(ln.released_idle),
        "queued_jobs": ln.queued_jobs,
        "queued_wait_h": (Decimal(ln.queued_wait_ms) / 3_600_000).quantize(Decimal("0.01")),
    }


# -- reservations -----------------------------------------------------------------------------------------------

RESERVATION_COLUMNS = ("reservation_id", "cluster", "team", "generation", "gpus", "start_utc", "end_utc", "actual",
                       "whatif", "why")  # fmt: skip


def idle_rules_differ(in_force: Policy, proposal: Policy) -> bool:
    """Whether the proposal changes when the reservation service warns about or releases an idle reservation."""
    a, b = in_force.governance.reservations, proposal.governance.reservations
    return (a.idle_warn_minutes, a.idle_release_minutes) != (b.idle_warn_minutes, b.idle_release_minutes)


def _idle_step(e: Mapping[str, Any]) -> bool:
    """A step the reservation service wrote for idleness: the only steps it writes as IDLE_WARNED or RELEASED
    (people's releases carry their own name; `release_event`)."""
    return e["actor"] == SERVICE_ACTOR and e["event_type"] in ("IDLE_WARNED", "RELEASED")


def idle_candidates(events: Sequence[Mapping[str, Any]], proposal: Policy, end_ms: int) -> list[Reservation]:
    """The reservations whose idle passes `replay_idle` replays under `proposal`: approved ones holding capacity
    before `end_ms`, as the steps other than the service's idle ones describe them."""
    held, _ = fold_reservations([e for e in events if not _idle_step(e)], proposal)
    return [r for r in held.values() if r.approved_by is not None and r.start_ms < min(r.until_ms(), end_ms)]


def replay_idle(events: Sequence[Mapping[str, Any]], proposal: Policy, activity: Mapping[str, Sequence[int]],
                end_ms: int) -> list[Mapping[str, Any]]:  # fmt: skip
    """The reservation steps with the service's idle warnings and early releases replayed under `proposal`: the
    stored ones out, and at each moment a pass could first see a reservation idle for the proposal's
    `idle_warn_minutes` or `idle_release_minutes` (before `end_ms`), the service's own `due` run on the reservation
    as the steps up to then describe it, with `idle_minutes_at` over `activity` (per reservation, the starts of
    the minutes its GPUs computed, `sinks.reservations.active_minutes`; a minute seen once it has ended). The
    live service passes every `sinks.reservations.every_s` seconds and sees a minute once it is stored, so its
    step falls that much later than the replay's, which is the earliest a pass could take it."""
    base: list[Mapping[str, Any]] = [e for e in events if not _idle_step(e)]
    rules = proposal.governance.reservations
    limits = [m for m in (rules.idle_warn_minutes, rules.idle_release_minutes) if m is not None]
    added: list[Mapping[str, Any]] = []
    for r in sorted(idle_candidates(events, proposal, end_ms), key=lambda r: r.reservation_id):
        minutes = sorted(activity.get(r.reservation_id, ()))
        # idle minutes reach a limit only `limit` minutes after a start or the end of a computed minute, and only
        # if no later computed minute has ended by then
        sinces = [r.start_ms, *(m + MINUTE_MS for m in minutes if m + MINUTE_MS > r.start_ms)]
        moments = sorted({s + limit * MINUTE_MS for i, s in enumerate(sinces) for limit in limits
                          if i + 1 == len(sinces) or s + limit * MINUTE_MS < sinces[i + 1]})  # fmt: skip
        for now in moments:
            if now >= end_ms:
                break
            held, _ = fold_reservations([e for e in base if int(e["ts_ms"]) <= now] + added, proposal)
            at = held.get(r.reservation_id)
            if at is None or not at.active(now):
                continue
            seen = bisect.bisect_right(minutes, now - MINUTE_MS)  # minutes ended by `now`
            idle = idle_minutes_at(at, minutes[seen - 1] if seen else None, now)
            steps = [e for e in due({at.reservation_id: at}, now, (), {at.reservation_id: idle}, proposal).events
                     if e["event_type"] in ("IDLE_WARNED", "RELEASED")]  # fmt: skip
            added += steps
            if any(e["event_type"] == "RELEASED" for e in steps):
                break
    return base + added


def reservations_changed(
    events: Sequence[Mapping[str, Any]],
    in_force: Policy,
    proposal: Policy,
    start_ms: int,
    end_ms: int,
    activity: Mapping[str, Sequence[int]] | None = None,
) -> list[dict[str, Any]]:
    """Reservations holding capacity in [start, end) under the policy in force whose fate the proposal's rules
    change: refused at request, or a later step (approval, extension, release) refused, so it ends otherwise, or
    released early for idleness at another time or not at all. Both sides are the reservation rules' own fold
    (`schemas.governance_reservations.fold`) over the same steps, each checked at its own time; `why` is the
    rule's refusal, or the service's words for an idle release. The policy in force keeps the idle steps the
    service took; when the proposal's idle limits differ (`idle_rules_differ`) they are replayed under it
    (`replay_idle`, over `activity`)."""
    held, _ = fold_reservations(events, in_force)
    replayed: list[Mapping[str, Any]] = list(events)
    if idle_rules_differ(in_force, proposal):
        replayed = replay_idle(events, proposal, activity or {}, end_ms)
    would, refused = fold_reservations(replayed, proposal)
    why_by_id = {x.event_id: x.why for x in refused}
    reasons: dict[str, list[str]] = defaultdict(list)
    for e in replayed:
        if e["event_id"] in why_by_id:
            reasons[str(e["reservation_id"])].append(why_by_id[e["event_id"]])
        elif _idle_step(e) and e["event_type"] == "RELEASED":
            reasons[str(e["reservation_id"])].append(str(e["text"]))
    out = []
    for rid, r in sorted(held.items()):
        if not (r.start_ms < end_ms and start_ms < r.until_ms()):
            continue
        w = would.get(rid)
        if w is not None and (w.state, w.end_ms, w.until_ms()) == (r.state, r.end_ms, r.until_ms()):
            continue
        fate = "refused" if w is None else f"{w.state.lower()} until {_utc(w.until_ms())}"
        out.append({"reservation_id": rid, "cluster": r.cluster, "team": r.team, "generation": r.generation,
                    "gpus": r.gpus, "start_utc": _utc(r.start_ms), "end_utc": _utc(r.until_ms()),
                    "actual": r.state.lower(), "whatif": fate, "why": "; ".join(reasons.get(rid, ()))})  # fmt: skip
    return out


# -- the whole comparison ---------------------------------------------------------------------------------------


class Replay(Protocol):
    """What `processors.whatif.replay_month` returns: the replayed alerts and reclaim actions."""

    @property
    def alerts(self) -> list[dict[str, Any]]: ...

    @property
    def actions(self) -> list[dict[str, Any]]: ...


# (runs, jobs, appeal steps, idle policy, policy in force) -> the replay: processors.whatif.replay_month, handed in
# by the command and the fleet page (a component does not import another).
ReplayMonth = Callable[[Any, Any, Any, IdlePolicy, "Policy | None"], Replay]


def whatif(
    client: Any,
    settings: Settings,
    period: str,
    proposal: Policy,
    by: str,
    replay_month: ReplayMonth,
    now_ms: int,
    base_idle: IdlePolicy | None = None,
    run_classes: Sequence[int] | None = None,
) -> Comparison:
    """`period` as stored beside the same month under `proposal`: the one comparison `policy whatif` prints and the
    fleet page shows. Every query is a read (`client` may be the read-only analyst's).
    `now_ms` stamps the proposed card's rows (`rate_card_rows`' load time; the caller's clock)."""
    current = load_policy(settings.policy_path) if settings.policy_path is not None else None
    base = base_idle if base_idle is not None else settings.processor.idle
    idle = proposal.idle_policy(base)
    month = load_month(client, period, run_classes, shortest_warning(idle))
    replayed = replay_month(month.minutes, month.jobs, month.appeals, idle, current)
    released = released_after(client, month, first_reclaims(month, replayed.actions))
    card = proposed_card(settings.sinks.ratecard_path, proposal)
    database = settings.clickhouse.database
    actual = actual_prices(client, database, period)
    proposed = proposed_prices(client, database, period, rate_card_rows(card, now_ms))
    result = compare(month, by, actual, proposed, replayed.alerts, replayed.actions, quota_limits(proposal), released)
    if current is not None:
        events = reservation_events(client)
        activity = {}
        if idle_rules_differ(current, proposal):
            activity = {r.reservation_id: active_minutes(client, r, month.end_ms)
                        for r in idle_candidates(events, proposal, month.end_ms)}  # fmt: skip
        changed = reservations_changed(events, current, proposal, month.start_ms, month.end_ms, activity)
        result = replace(result, reservations=changed)
    return result
