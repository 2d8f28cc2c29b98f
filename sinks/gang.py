"""A gang is judged whole: warned once and reclaimed once, when every member is idle (issue 18).

The pods of one Kueue Workload, JobSet, Volcano PodGroup or MPIJob/PyTorchJob carry one `gang_id` in their
job events (`producers/kube.py`); the processors judge each pod (one job each) on its own and emit its idle
alerts and reclaim action. Two consumers make the gang one unit:
- the chat sink posts one warning naming the gang once every member still holding devices is warned (the
  gang is idle only when every device is), one reclaim notice once every member's grace is over, and one
  resolution when a member wakes after the gang was warned; a member's own alerts are held, not posted
  (`gang_alert`);
- the reclaim executor re-checks the whole gang before it acts: every other member still holding devices
  must be idle and past its own grace (its reclaim notice is out), so the gang is reclaimed at the time its
  warning named, the latest member's, and once: Kueue deactivates the whole Workload
  (`sinks/kube_owner.py`). One busy member (or one without telemetry) keeps the gang (`gang_verdict`).

Pure cores: `gang_alert` and `gang_verdict`. The adapter `ClickHouseGangs` reads the members from
`job_events` and their latest idle alerts from `alerts` (bound parameters), merged with the alerts and
actions this process has seen itself, which the warehouse may not hold yet.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sinks.reclaim import CLOSING_EVENTS, OPENING_EVENTS, JobNow, JobState, Recheck, recheck

HOLDING = ("STARTED", "RESUMED", "UPDATED")  # events that name devices: a member of the gang holds some
IDLE_KINDS = ("IDLE_WARNING", "RECLAIM_NOTICE", "IDLE_RESOLVED")
OPEN_KINDS = frozenset({"IDLE_WARNING", "RECLAIM_NOTICE"})  # a member warned in its current idle spell
MINUTE_MS = 60_000
SEEN_CAPACITY = 10_000  # members whose latest alert this process remembers


@dataclass(frozen=True, slots=True)
class MemberAlert:
    """A gang member's latest idle alert (the record as the alerts topic carries it)."""

    record: Mapping[str, Any]

    @property
    def job_id(self) -> str:
        return str(self.record["job_id"])

    @property
    def kind(self) -> str:
        return str(self.record["kind"])

    @property
    def ts_ms(self) -> int:
        return int(self.record["ts_ms"])

    @property
    def warned(self) -> bool:
        return self.kind in OPEN_KINDS

    @property
    def idle_since_ms(self) -> int:
        """Start of the idle spell a warning or reclaim notice is about: its minutes are consecutive (a gap or a
        busy minute ends the spell) and the alert is stamped at the end of the last one."""
        return self.ts_ms - int(self.record.get("idle_minutes") or 0) * MINUTE_MS


@dataclass(frozen=True, slots=True)
class Gang:
    gang_id: str
    cluster: str
    members: tuple[str, ...]  # jobs (pods) of the gang whose events named devices
    ended: frozenset[str] = frozenset()  # members that released their devices

    def live(self, also: str) -> list[str]:
        """The members still holding devices, and `also` (a member that sends idle alerts holds some)."""
        return sorted({m for m in self.members if m not in self.ended} | {also})


def _gang_id(*parts: object) -> str:
    return hashlib.sha1("/".join(map(str, parts)).encode(), usedforsecurity=False).hexdigest()[:24]


def gang_alert(gang: Gang, alert: Mapping[str, Any], latest: Mapping[str, MemberAlert]) -> dict[str, Any] | None:
    """The gang's alert that a member's idle `alert` completes, or None: held, the gang is not there yet.

    `latest`: each member's latest idle alert before this one (a member absent has none). A warning completes
    the gang's when every live member is warned; a reclaim notice, when every live member's grace is over; a
    resolution resolves the gang's warning when the gang was warned just before it. The gang's alert id is
    made from the gang and each member's idle spell, so a replay makes the same one and each spell of the
    gang (from the latest member's warning to the first member awake) has its own."""
    this = MemberAlert(alert)
    members = gang.live(this.job_id)
    if this.kind == "IDLE_RESOLVED":
        before = latest.get(this.job_id)
        spell = {**latest, this.job_id: before} if before is not None else None
        if spell is None or not all(m in spell and spell[m].warned for m in members):
            return None
        return _gang_record(gang, alert, "IDLE_RESOLVED", {m: spell[m] for m in members}, resolved_by=this.job_id)
    now = {**latest, this.job_id: this}
    if this.kind == "IDLE_WARNING":
        done = all(m in now and now[m].warned for m in members)
    else:  # RECLAIM_NOTICE
        done = all(m in now and now[m].kind == "RECLAIM_NOTICE" for m in members)
    return _gang_record(gang, alert, this.kind, {m: now[m] for m in members}) if done else None


def _gang_record(gang: Gang, alert: Mapping[str, Any], kind: str, spell: Mapping[str, MemberAlert],
                 resolved_by: str | None = None) -> dict[str, Any]:  # fmt: skip
    episode = [(m, a.idle_since_ms) for m, a in sorted(spell.items())]
    warning_id = _gang_id("gang", "IDLE_WARNING", gang.cluster, gang.gang_id, *episode)
    devices = sorted({d for a in spell.values() for d in a.record.get("device_uuids") or ()})
    costs = [a.record.get("cost_so_far") for a in spell.values()]
    cost = None if any(c is None for c in costs) else round(sum(float(c) for c in costs if c is not None), 6)
    due = [int(a.record["action_at_ms"]) for a in spell.values() if a.record.get("action_at_ms") is not None]
    idle = min(int(a.record.get("idle_minutes") or 0) for a in spell.values())
    names = ", ".join(list(spell)[:8]) + (f" and {len(spell) - 8} more" if len(spell) > 8 else "")
    if kind == "IDLE_WARNING":
        message = (f"Gang {gang.gang_id}: all {len(spell)} pods ({len(devices)} devices) are idle, the whole gang "
                   f"for {idle} minutes: {names}. The gang is judged, warned and reclaimed as one.")  # fmt: skip
    elif kind == "RECLAIM_NOTICE":
        message = f"Gang {gang.gang_id}: every pod's grace is over ({names}); {alert.get('action')} of the whole gang."
    else:
        message = f"Gang {gang.gang_id} is no longer idle: pod {resolved_by} woke up; no action will be taken."
    return {
        **alert,
        "alert_id": warning_id if kind == "IDLE_WARNING" else _gang_id("gang", kind, warning_id),
        "kind": kind,
        "job_id": gang.gang_id,
        "gang_id": gang.gang_id,
        "members": list(spell),
        "member_alert_ids": [str(a.record["alert_id"]) for a in spell.values()],
        "device_uuids": devices,
        "idle_minutes": idle,
        "cost_so_far": cost,
        "action_at_ms": max(due) if due and kind != "IDLE_RESOLVED" else alert.get("action_at_ms"),
        "message": message,
    }


def gang_verdict(gang_id: str, job_id: str, members: Mapping[str, JobNow], due: Mapping[str, bool] | None = None
                 ) -> Recheck:  # fmt: skip
    """Whether the gang may be reclaimed, given the state of its members other than `job_id` (which passed
    its own re-check): each must be idle and, when `due` is given, past its own grace (its reclaim notice is
    out), or have released its devices (ended)."""
    for member in sorted(members):
        if member == job_id:
            continue
        v = recheck(members[member])
        if v.reason == "ended":
            continue
        if not v.ok:
            return Recheck(False, f"gang-{v.reason}", f"gang {gang_id}: member {member}: {v.detail}"[:500])
        if due is not None and not due.get(member, False):
            return Recheck(False, "gang-not-due", f"gang {gang_id}: member {member}: idle, its grace not over yet")
    return Recheck(True, "ok", f"gang {gang_id}: all {len(members)} member(s) idle or ended")


class ClickHouseGangs:
    """The gangs as the warehouse holds them, for the chat sink (`alert`: a member's alert -> the gang's) and
    the reclaim executor (`__call__`: `(cluster, job_id) -> Recheck` of the whole gang). Alerts and actions
    this process saw are remembered (bounded), since the alerts sink may not have written them yet: two
    members warned in the same minute each see the other."""

    def __init__(self, client: Any, job_state: JobState | None = None) -> None:
        self._client = client
        self._job_state = job_state
        self._seen: OrderedDict[tuple[str, str], MemberAlert] = OrderedDict()

    def gang(self, cluster: str, job_id: str) -> Gang | None:
        """The job's latest gang, its members (jobs of that gang whose events named devices: the gang object's
        own events, a Workload's, hold none) and which of them ended; None for a job in no gang."""
        params: dict[str, Any] = {"cluster": cluster, "job": job_id, "holding": list(HOLDING),
                                  "opening": list(OPENING_EVENTS), "closing": list(CLOSING_EVENTS)}  # fmt: skip
        found = self._client.query(
            "SELECT gang_id FROM job_events FINAL WHERE cluster = {cluster:String} AND job_id = {job:String} "
            "AND gang_id IS NOT NULL ORDER BY ts_ms DESC LIMIT 1",
            parameters=params,
        ).result_rows
        if not found:
            return None
        params["gang"] = found[0][0]
        rows = self._client.query(
            "SELECT job_id, maxIf(ts_ms, event_type IN {opening:Array(String)}), "
            "countIf(event_type IN {opening:Array(String)}), maxIf(ts_ms, event_type IN {closing:Array(String)}), "
            "countIf(event_type IN {closing:Array(String)}) "
            "FROM job_events FINAL WHERE cluster = {cluster:String} AND gang_id = {gang:String} GROUP BY job_id "
            "HAVING countIf(event_type IN {holding:Array(String)} AND allocations != '[]') > 0 ORDER BY job_id",
            parameters=params,
        ).result_rows
        ended = frozenset(str(j) for j, last_open, opens, last_close, closes in rows
                          if closes and (not opens or last_close >= last_open))  # fmt: skip
        return Gang(str(found[0][0]), cluster, tuple(str(r[0]) for r in rows), ended)

    def members(self, cluster: str, job_id: str) -> tuple[str | None, list[str]]:
        gang = self.gang(cluster, job_id)
        return (None, []) if gang is None else (gang.gang_id, list(gang.members))

    def latest(self, cluster: str, jobs: Iterable[str], upto_ms: int = 2**62, but: str = "") -> dict[str, MemberAlert]:
        """Each job's latest idle alert stamped at or before `upto_ms`, other than the alert `but`: the
        warehouse's or, when later, one this process saw. Bounded by the alert being judged, a replay judges
        it against the gang as it was then."""
        jobs = sorted(set(jobs))
        out: dict[str, MemberAlert] = {}
        rows = self._client.query(
            "SELECT alert_id, kind, ts_ms, job_id, idle_minutes, action_at_ms, action, device_uuids, cost_so_far "
            "FROM alerts FINAL WHERE cluster = {cluster:String} AND job_id IN {jobs:Array(String)} "
            "AND kind IN {kinds:Array(String)} AND ts_ms <= {upto:Int64} AND alert_id != {but:String} "
            "ORDER BY ts_ms DESC LIMIT 1 BY job_id",
            parameters={"cluster": cluster, "jobs": jobs, "kinds": list(IDLE_KINDS), "upto": upto_ms, "but": but},
        ).named_results()
        for row in rows:
            out[str(row["job_id"])] = MemberAlert(dict(row))
        for job in jobs:
            seen = self._seen.get((cluster, job))
            if seen is None or seen.ts_ms > upto_ms or seen.record.get("alert_id") == but:
                continue
            if job not in out or seen.ts_ms > out[job].ts_ms:
                out[job] = seen
        return out

    def saw(self, alert: Mapping[str, Any]) -> None:
        key = (str(alert["cluster"]), str(alert["job_id"]))
        self._seen[key] = MemberAlert(dict(alert))
        self._seen.move_to_end(key)
        if len(self._seen) > SEEN_CAPACITY:
            self._seen.popitem(last=False)

    def alert(self, alert: Mapping[str, Any]) -> tuple[bool, dict[str, Any] | None]:
        """(whether the alert's job is in a gang of two or more, the gang's alert it completes or None)."""
        if alert.get("kind") not in IDLE_KINDS or not alert.get("job_id"):
            return False, None
        cluster, job = str(alert["cluster"]), str(alert["job_id"])
        gang = self.gang(cluster, job)
        if gang is None or len(gang.members) <= 1:
            return False, None
        latest = self.latest(cluster, gang.members, int(alert["ts_ms"]), str(alert["alert_id"]))
        self.saw(alert)
        return True, gang_alert(gang, alert, latest)

    def __call__(self, action: Mapping[str, Any]) -> Recheck:
        """The executor's gang check of a member's reclaim action (which passed its own re-check)."""
        if self._job_state is None:
            raise RuntimeError("ClickHouseGangs needs a job_state to judge a gang for reclaim")
        cluster, job_id = str(action.get("cluster", "")), str(action.get("job_id", ""))
        # this member's grace is over, as its reclaim notice says (which the warehouse may not hold yet)
        self.saw({**action, "kind": "RECLAIM_NOTICE", "alert_id": f"action:{action.get('action_id')}",
                  "ts_ms": int(action.get("ts_ms") or 0)})  # fmt: skip
        gang = self.gang(cluster, job_id)
        if gang is None or len(gang.members) <= 1:
            return Recheck(True, "ok", "not in a gang")
        others = [m for m in gang.members if m != job_id]
        latest = self.latest(cluster, others, int(action.get("ts_ms") or 2**62))  # the gang when it was decided
        due = {m: m in latest and latest[m].kind == "RECLAIM_NOTICE" for m in others}
        return gang_verdict(gang.gang_id, job_id, {m: self._job_state(cluster, m) for m in others}, due)
