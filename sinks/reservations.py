"""Reservations onto the schedulers and off again (issue 19), and what they cost.

- **Slurm** (`SlurmReservations`): `scontrol create reservation ReservationName=gpuledger-<id> StartTime=..
  EndTime=.. Accounts=<the team's account> Nodes=<nodes> Flags=IGNORE_JOBS`. Slurm 22.05 cannot reserve GPUs
  (`TRES type 'gres/gpu:h100' not supported with reservations`), so a reservation holds whole nodes: the
  fewest nodes carrying the generation's gres type that add up to the GPUs asked for (the named ones when given,
  from `scontrol -o show node`). Slurm drops a reservation at its EndTime by itself; an extension is `scontrol
  update ... EndTime=`, a release or an early end `scontrol delete`. Times are given in this host's local time,
  as scontrol reads them.
- **Kueue** (`KueueQuota`): while a reservation is active, the team's ClusterQueue has the reserved GPUs added
  to the generation's flavor's `nominalQuota` (policy quota + every active reservation of the team and
  generation), and the bump is taken back when it ends. Each pass puts a rendered bump back if it went missing
  (a `policy apply` meanwhile).
- `reconcile`: one pass of the reservation service: the pure `due` of `schemas/governance_reservations.py`,
  carried out; each engine change becomes a RENDERED or REMOVED step. An engine that fails is logged and tried
  again at the next pass (no step is written for it).
- The charge (`reservation_charges`): GPUs x the part of the window that has passed, per month, less the team's
  own allocated GPU-seconds of that generation (on the reserved nodes, when known) inside the window, capped
  at the reserved GPUs each minute: those are charged as jobs already, so reserved capacity is paid once,
  used or not. Priced at the on-prem, non-preemptible rate of the generation in force at the window's start.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from base.errors import ServiceError
from base.kube import load_credentials
from schemas.governance_reservations import (
    Reservation,
    due,
    idle_minutes_at,
    month_windows,
    removed_event,
    rendered_event,
)
from schemas.policy import Policy
from sinks.statements import Charge

log = logging.getLogger("gpuledger.reservations")
Runner = Callable[[Sequence[str]], str]  # argv -> stdout; ServiceError when it fails
SCONTROL_TIMEOUT_S = 60.0
PREFIX = "gpuledger-"
_GRES = re.compile(r"gpu:([A-Za-z0-9_.]{1,32}):(\d{1,6})")
_FIELD = re.compile(r"(\w+)=(\S*)")


def run_command(argv: Sequence[str]) -> str:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ServiceError(f"{argv[0]}: {exc}") from exc
    if done.returncode != 0:
        raise ServiceError(f"{' '.join(argv[:3])} exited {done.returncode}: {done.stderr.strip()[:300]}")
    return done.stdout


def slurm_time(ms: int) -> str:
    """An instant as scontrol reads it: local time, to the second."""
    return dt.datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%dT%H:%M:%S")  # noqa: DTZ006 (scontrol's local time)


def parse_nodes(text: str) -> dict[str, dict[str, int]]:
    """`scontrol -o show node` -> node -> gres type -> GPUs."""
    out: dict[str, dict[str, int]] = {}
    for line in text.splitlines()[:100_000]:
        fields = dict(_FIELD.findall(line))
        name = fields.get("NodeName")
        if name:
            out[name] = {t: int(n) for t, n in _GRES.findall(fields.get("Gres", ""))}
    return out


def parse_reservations(text: str) -> dict[str, dict[str, str]]:
    """`scontrol -o show reservation` -> name -> its fields (only gpuledger's)."""
    out: dict[str, dict[str, str]] = {}
    for line in text.splitlines()[:100_000]:
        fields = dict(_FIELD.findall(line))
        name = fields.get("ReservationName", "")
        if name.startswith(PREFIX):
            out[name] = fields
    return out


def choose_nodes(nodes: Mapping[str, Mapping[str, int]], gres: str, gpus: int, wanted: Iterable[str] = ()) -> list[str]:
    """The named nodes, or the fewest nodes carrying `gres` (most GPUs first, then by name) that hold `gpus`."""
    wanted = list(wanted)
    if wanted:
        unknown = [n for n in wanted if n not in nodes]
        if unknown:
            raise ServiceError(f"Slurm has no node {unknown[0]!r}")
        return wanted
    chosen, held = [], 0
    for name in sorted(nodes, key=lambda n: (-nodes[n].get(gres, 0), n)):
        if held >= gpus or nodes[name].get(gres, 0) == 0:
            break
        chosen.append(name)
        held += nodes[name][gres]
    if held < gpus:
        raise ServiceError(f"Slurm's nodes hold {held} {gres} GPUs, fewer than the {gpus} reserved")
    return chosen


class Engine(Protocol):
    engine: str

    def render(self, r: Reservation) -> tuple[str, list[str], str]: ...  # (its name for it, nodes, what happened)

    def remove(self, r: Reservation) -> str: ...

    def sync(self, live: Iterable[Reservation], now_ms: int) -> None: ...


class SlurmReservations:
    engine = "SLURM"

    def __init__(self, policy: Policy, run: Runner = run_command) -> None:
        self._policy = policy
        self._run = run

    def name(self, r: Reservation) -> str:
        return PREFIX + r.reservation_id

    def present(self) -> dict[str, dict[str, str]]:
        return parse_reservations(self._run(["scontrol", "-o", "show", "reservation"]))

    def render(self, r: Reservation) -> tuple[str, list[str], str]:
        name = self.name(r)
        existing = self.present().get(name)
        if existing is not None:  # a pass that stopped before writing RENDERED
            return name, existing.get("Nodes", "").split(","), "already in Slurm"
        team = self._policy.team(r.team)
        gres = self._policy.generations[r.generation].slurm_gres
        nodes = choose_nodes(parse_nodes(self._run(["scontrol", "-o", "show", "node"])), gres, r.gpus, r.nodes)
        out = self._run([
            "scontrol", "create", "reservation", f"ReservationName={name}", f"StartTime={slurm_time(r.start_ms)}",
            f"EndTime={slurm_time(r.end_ms)}", f"Accounts={team.account}", f"Nodes={','.join(nodes)}",
            "Flags=IGNORE_JOBS",
        ])  # fmt: skip
        return name, nodes, out.strip() or "Reservation created"

    def remove(self, r: Reservation) -> str:
        name = self.name(r)
        if name not in self.present():
            return "already gone from Slurm (it ends a reservation at its EndTime)"
        self._run(["scontrol", "delete", f"ReservationName={name}"])
        return "deleted"

    def sync(self, live: Iterable[Reservation], now_ms: int) -> None:
        """An extended reservation's new end onto Slurm."""
        present = None
        for r in live:
            if self.engine not in r.rendered or self.engine in r.removed or now_ms >= r.end_ms:
                continue
            present = present if present is not None else self.present()
            fields = present.get(self.name(r))
            if fields is not None and fields.get("EndTime") != slurm_time(r.end_ms):
                self._run(["scontrol", "update", f"ReservationName={self.name(r)}", f"EndTime={slurm_time(r.end_ms)}"])


class KueueQuota:
    """The team's ClusterQueue nominalQuota of the generation's flavor: the policy's quota plus the GPUs of every
    active reservation of that team and generation (`api`: a kubernetes CustomObjectsApi)."""

    engine = "KUEUE"
    group, version, plural = "kueue.x-k8s.io", "v1beta2", "clusterqueues"

    def __init__(self, policy: Policy, api: Any = None, kubeconfig: str | None = None) -> None:
        self._policy = policy
        self._api = api
        self._kubeconfig = kubeconfig
        self._active: list[Reservation] = []

    def _custom(self) -> Any:
        if self._api is None:
            from kubernetes import client

            load_credentials(self._kubeconfig)
            self._api = client.CustomObjectsApi()
        return self._api

    def desired(self, team: str, generation: str) -> int:
        quota = self._policy.team(team).quota.get(generation, 0)
        return quota + sum(r.gpus for r in self._active if r.team == team and r.generation == generation)

    def _apply(self, team: str, generation: str) -> tuple[bool, str]:
        """Set the quota the active reservations call for: (whether it was patched, what happened)."""
        flavor = self._policy.generations[generation].kueue_flavor
        resource = self._policy.kueue.resource
        try:
            cq = self._custom().get_cluster_custom_object(self.group, self.version, self.plural, team)
        except Exception as exc:
            raise ServiceError(f"ClusterQueue {team}: {exc}") from exc
        groups = cq["spec"]["resourceGroups"]
        want = self.desired(team, generation)
        for group in groups:
            for fl in group.get("flavors", []):
                for res in fl.get("resources", []) if fl.get("name") == flavor else []:
                    if res.get("name") == resource:
                        if str(res.get("nominalQuota")) == str(want):
                            return False, f"ClusterQueue {team} {flavor} nominalQuota already {want}"
                        res["nominalQuota"] = want
                        body = {"spec": {"resourceGroups": groups}}
                        try:
                            self._custom().patch_cluster_custom_object(self.group, self.version, self.plural, team,
                                                                       body)  # fmt: skip
                        except Exception as exc:
                            raise ServiceError(f"ClusterQueue {team}: {exc}") from exc
                        return True, f"ClusterQueue {team} {flavor} nominalQuota {want}"
        raise ServiceError(f"ClusterQueue {team} has no {resource} quota in flavor {flavor}")

    def sync(self, live: Iterable[Reservation], now_ms: int) -> None:
        """The active reservations, and their bump put back where it went missing since it was rendered (a
        `policy apply` sets the policy's quota alone): the service is what holds the quota, not its first patch."""
        self._active = [r for r in live if r.active(now_ms)]
        on = {(r.team, r.generation) for r in self._active
              if self.engine in r.rendered and self.engine not in r.removed}  # fmt: skip
        for team, generation in sorted(on):
            try:
                patched, text = self._apply(team, generation)
            except ServiceError as exc:
                log.warning("%s: %s", self.engine, exc)
                continue
            if patched:
                log.warning("reservations of %s: %s put back", team, text)

    def render(self, r: Reservation) -> tuple[str, list[str], str]:
        return r.team, [], self._apply(r.team, r.generation)[1]

    def remove(self, r: Reservation) -> str:
        return self._apply(r.team, r.generation)[1]


def reconcile(existing: Mapping[str, Reservation], policy: Policy, now_ms: int, engines: Sequence[Engine],
              idle_minutes: Mapping[str, int] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """One pass: the steps to publish (expiries, idle warnings and releases, what went onto or off an engine)."""
    plan = due(existing, now_ms, [e.engine for e in engines], idle_minutes, policy)
    ended = {e["reservation_id"] for e in plan.events if e["event_type"] in ("EXPIRED", "RELEASED")}
    live = [r for r in existing.values() if r.live and r.reservation_id not in ended]
    by_name = {e.engine: e for e in engines}
    events = list(plan.events)
    for engine in engines:
        try:
            engine.sync(live, now_ms)
        except ServiceError as exc:
            log.warning("%s: %s", engine.engine, exc)
    for name, r in plan.render:
        if r.reservation_id in ended:
            continue
        try:
            ref, nodes, text = by_name[name].render(r)
        except ServiceError as exc:
            log.warning("reservation %s onto %s: %s", r.reservation_id, name, exc)
            continue
        events.append(rendered_event(r, name, ref, nodes, now_ms, text[:500]))
    for name, r in plan.remove:  # ended ones, those ending in this pass included
        try:
            text = by_name[name].remove(r)
        except ServiceError as exc:
            log.warning("reservation %s off %s: %s", r.reservation_id, name, exc)
            continue
        events.append(removed_event(r, name, now_ms, text[:500]))
    return events


# -- idle and the charge (ClickHouse) --------------------------------------------------------------


# the minutes a reservation's team computed on its generation (on its nodes, when known) from {s}
_ACTIVE_MINUTES = (
    "FROM device_minutes FINAL WHERE cluster = {c:String} AND team = {t:String} AND generation = {g:String} "
    "AND minute_start_ms >= {s:Int64} AND active_s + starved_s > 0 "
    "AND (length({n:Array(String)}) = 0 OR has({n:Array(String)}, node))"
)


def _active_parameters(r: Reservation) -> dict[str, Any]:
    return {"c": r.cluster, "t": r.team, "g": r.generation, "s": r.start_ms, "n": list(r.rendered_nodes)}


def idle_minutes(client: Any, reservations: Iterable[Reservation], now_ms: int) -> dict[str, int]:
    """Per active reservation: minutes since its team last computed on the reserved generation (on its nodes,
    when known) within the window, or since its start (`idle_minutes_at`)."""
    out = {}
    for r in reservations:
        if not r.active(now_ms):
            continue
        rows = client.query(f"SELECT max(minute_start_ms) {_ACTIVE_MINUTES}", parameters=_active_parameters(r))
        last = rows.result_rows[0][0] if rows.result_rows and rows.result_rows[0][0] else None
        out[r.reservation_id] = idle_minutes_at(r, None if last is None else int(last), now_ms)
    return out


def active_minutes(client: Any, r: Reservation, end_ms: int) -> list[int]:
    """The minutes (starts, ascending) before `end_ms` that `idle_minutes` counts as `r`'s GPUs computing."""
    rows = client.query(
        f"SELECT DISTINCT minute_start_ms {_ACTIVE_MINUTES} AND minute_start_ms < {{e:Int64}} ORDER BY 1",
        parameters={**_active_parameters(r), "e": end_ms},
    ).result_rows
    return [int(row[0]) for row in rows]


def _used_inside(client: Any, r: Reservation, start_ms: int, end_ms: int) -> int:
    rows = client.query(
        "SELECT sum(least(s, {cap:Int64})) FROM (SELECT minute_start_ms, sum(allocated_s) AS s FROM device_minutes "
        "FINAL WHERE cluster = {c:String} AND team = {t:String} AND generation = {g:String} "
        "AND minute_start_ms >= {a:Int64} AND minute_start_ms < {b:Int64} "
        "AND (length({n:Array(String)}) = 0 OR has({n:Array(String)}, node)) GROUP BY minute_start_ms)",
        parameters={"cap": r.gpus * 60, "c": r.cluster, "t": r.team, "g": r.generation, "a": start_ms,
                    "b": end_ms, "n": list(r.rendered_nodes)},
    ).result_rows
    return int(rows[0][0] or 0) if rows else 0


def _rate(client: Any, generation: str, day: dt.date) -> int:
    rows = client.query(
        "SELECT rate_micro_per_gpu_hour FROM v_rate_card WHERE generation = {g:String} AND pricing_tier = 'on-prem' "
        "AND NOT preemptible AND effective_from <= {d:Date} ORDER BY effective_from DESC LIMIT 1",
        parameters={"g": generation, "d": day},
    ).result_rows
    return int(rows[0][0]) if rows else 0


def reservation_charges(client: Any, reservations: Iterable[Reservation], now_ms: int) -> list[Charge]:
    """A reservation line per approved reservation and month: reserved GPU-seconds up to now less the team's own
    use inside it, at the generation's on-prem rate (see the module's docstring)."""
    out = []
    for r in sorted(reservations, key=lambda r: r.reservation_id):
        if r.approved_by is None:
            continue
        end = min(r.until_ms(), now_ms)
        for month, start, stop in month_windows(r.start_ms, end):
            reserved = r.gpus * (stop - start) // 1000
            used = min(reserved, _used_inside(client, r, start, stop))
            rate = _rate(client, r.generation, dt.datetime.fromtimestamp(start / 1000, dt.UTC).date())
            seconds = reserved - used
            if seconds <= 0:
                continue
            note = f"{r.gpus} {r.generation} GPUs reserved {reserved} s, {used} s of it used by the team's jobs"
            out.append(Charge(kind="reservation", ref=f"{r.reservation_id}/{month}", team=r.team, source_period=month,
                              charge_num=seconds * rate, cluster=r.cluster, generation=r.generation,
                              allocated_s=seconds, rate_micro=rate, note=note))  # fmt: skip
    return out
