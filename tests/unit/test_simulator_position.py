"""`make up; make down; make up` on one state dir (issue 18): the restarted real-time simulator continues its
run from the position saved in the state dir instead of publishing its history again.

Run 1 starts with a 120 s backfill and is stopped (the process killed from its sleep) part-way; run 2 starts
100 s later on the same state dir. Together they publish every record of the plan up to the end of run 2,
each record (job event, sample, inventory) once, except those of the chunk in flight at the stop, which come
again identical (at least once, deduplicated downstream); no job id names two jobs."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from producers.simulator import SimConfig
from producers.simulator import position as pos
from producers.simulator.run import run
from producers.simulator.stream import simulate
from schemas.topics import Topic


class Stop(Exception):
    pass


class Clock:
    def __init__(self, now: float, stop_at: float | None = None) -> None:
        self.now, self.stop_at = now, stop_at

    def time(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s
        if self.stop_at is not None and self.now >= self.stop_at:
            raise Stop  # `make down`: the process is stopped where it waits


class Sink:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def publish(self, topic: Topic, key: bytes, record: dict[str, Any]) -> None:
        self.sent.append((topic.name, json.dumps(record, sort_keys=True)))

    def flush(self, timeout_s: float = 30.0) -> None:
        pass


def up(cfg: SimConfig, where: Path, clock: Clock, sink: Sink) -> pos.Restart:
    plan = pos.restart(pos.load(where), cfg, int(clock.now * 1000), 120)
    with contextlib.suppress(Stop):
        run(plan.cfg, sink, realtime=True, clock=clock.time, sleep=clock.sleep, backfill_s=plan.backfill_s,
            resume_s=plan.resume_s, on_flushed=lambda ms: pos.save(where, pos.position_of(plan.cfg, ms)))  # fmt: skip
    return plan


def test_a_restart_continues_without_replaying_history(tmp_path: Path) -> None:
    where = tmp_path / "simulator" / "position.json"
    cfg = SimConfig(seed=3, nodes=2, duration_s=900, dead_exporter_nodes=0)
    t0 = 1_800_000_000.0
    first, second = Sink(), Sink()
    plan1 = up(cfg, where, Clock(t0, stop_at=t0 + 150), first)  # down 150 s after up
    assert plan1.resume_s == 0 and plan1.backfill_s == 120
    saved = pos.load(where)
    assert saved is not None and saved.start_ms == plan1.cfg.start_ms
    plan2 = up(cfg, where, Clock(t0 + 250, stop_at=t0 + 400), second)  # up again 100 s later
    assert plan2.cfg == plan1.cfg and plan2.resume_s == (saved.through_ms - saved.start_ms) // 1000
    assert plan2.resume_s > 0 and "continuing" in plan2.why

    published = first.sent + second.sent
    through = json.loads(where.read_text())["through_ms"]
    expected = Counter((t.name, json.dumps(r, sort_keys=True)) for t, _, r in simulate(
        plan1.cfg, start_s=0, end_s=(through - plan1.cfg.start_ms) // 1000))  # fmt: skip
    got = Counter(published)
    assert set(expected) <= set(got)  # nothing lost up to what run 2 flushed
    again = [rec for rec, n in got.items() if n > 1]
    in_flight = {json.loads(r)["ts_ms"] // 60_000 for _, r in again}
    assert len(in_flight) <= 1  # only the minute-chunk in flight at the stop came twice
    assert not any(json.loads(r)["ts_ms"] < saved.through_ms for _, r in second.sent)
    jobs: dict[str, set[tuple[Any, ...]]] = {}
    for name, r in got:
        if name.startswith("sched."):
            e = json.loads(r)
            jobs.setdefault(e["job_id"], set()).add((e["user"], e["submit_ts_ms"]))
    assert jobs and all(len(v) == 1 for v in jobs.values())  # each job id is one job


def test_without_a_position_or_with_another_plan_it_starts_fresh(tmp_path: Path) -> None:
    cfg = SimConfig(seed=3, nodes=2, duration_s=900)
    fresh = pos.restart(None, cfg, 1_800_000_000_000, 120)
    assert (fresh.cfg.start_ms, fresh.resume_s, fresh.backfill_s) == (1_799_999_880_000, 0, 120)
    other = pos.position_of(SimConfig(seed=4, nodes=2, duration_s=900), 1_799_999_990_000)
    assert pos.restart(other, cfg, 1_800_000_000_000, 120).resume_s == 0
    bad = tmp_path / "position.json"
    bad.write_text("{not json")
    assert pos.load(bad) is None


def test_a_plan_that_ran_out_is_followed_without_overlap_or_reused_ids() -> None:
    cfg = SimConfig(seed=3, nodes=2, duration_s=900)
    old = pos.position_of(pos.replace(cfg, start_ms=1_800_000_000_000), 1_800_000_900_000)
    nxt = pos.restart(old, cfg, 1_800_000_950_000, 3600)  # the backfill would reach back over the old plan
    assert nxt.cfg.start_ms == old.end_ms and nxt.resume_s == 0 and nxt.backfill_s == 50
    assert nxt.cfg.job_id_base == old.job_id_base + pos.ID_BLOCK
    ids = {r["job_id"] for t, _, r in simulate(nxt.cfg, start_s=0, end_s=900) if t.name.startswith("sched.")}
    old_ids = {r["job_id"] for t, _, r in simulate(pos.replace(cfg, start_ms=old.start_ms), start_s=0, end_s=900)
               if t.name.startswith("sched.")}  # fmt: skip
    assert ids and old_ids and not ids & old_ids


@pytest.fixture(autouse=True)
def _no_real_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    monkeypatch.setattr(time, "sleep", lambda s: (_ for _ in ()).throw(AssertionError("slept for real")))
