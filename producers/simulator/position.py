"""Where a real-time simulator stopped, kept in the state dir, so a restart continues its run (issue 18).

`gpuledger up` runs `simulate run --backfill`: started cold it publishes the last hours of its plan at once,
then follows the wall clock (cluster time = wall time). Stopped and started again on the same state dir, a
second backfill would publish those hours again over what is recorded, with the same job ids for other
jobs. Instead the run's position (its plan and the event time published through) is saved after every
flushed chunk, and a restart with the same plan continues from there: the gap while it was down goes out at
once, nothing before it twice. A plan that has run out is followed by a new one that starts where it ended,
its job ids in a fresh block (`SimConfig.job_id_base`).

Pure core: `restart(position, cfg, now_ms, backfill_s) -> Restart`; `load` / `save` are the file.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from producers.simulator.model import SimConfig

log = logging.getLogger(__name__)
ID_BLOCK = 100_000  # job ids of one plan: far more than any plan makes


@dataclass(frozen=True, slots=True)
class Position:
    seed: int
    nodes: int
    cluster: str
    duration_s: int
    start_ms: int
    job_id_base: int
    through_ms: int  # every record with ts_ms < through_ms is published and flushed
    kube_nodes: int = 0  # the Kubernetes cluster beside it (0: none; a position saved before it had none)

    def same_plan(self, cfg: SimConfig) -> bool:
        return (self.seed, self.nodes, self.cluster, self.duration_s, self.kube_nodes) == (
            cfg.seed, cfg.nodes, cfg.cluster, cfg.duration_s, cfg.kube_nodes)  # fmt: skip

    @property
    def end_ms(self) -> int:
        return self.start_ms + self.duration_s * 1000


@dataclass(frozen=True, slots=True)
class Restart:
    cfg: SimConfig  # the plan to run (its start and job id block)
    resume_s: int  # seconds of the plan already published: skipped
    backfill_s: int  # how far behind the wall clock the plan's start is (pacing)
    why: str


def restart(pos: Position | None, cfg: SimConfig, now_ms: int, backfill_s: int) -> Restart:
    """What a real-time run with `backfill_s` does given the saved position (pure)."""
    fresh = replace(cfg, start_ms=(now_ms // 1000 - backfill_s) * 1000)
    if pos is None or not pos.same_plan(cfg):
        return Restart(fresh, 0, backfill_s, "no run of this plan in the state dir: a fresh start")
    if pos.through_ms < pos.end_ms:
        run = replace(cfg, start_ms=pos.start_ms, job_id_base=pos.job_id_base)
        done_s = (pos.through_ms - pos.start_ms) // 1000
        behind = max(0, now_ms // 1000 - pos.start_ms // 1000)
        return Restart(run, done_s, behind, f"continuing the run from {done_s} s of its plan")
    start_ms = max(fresh.start_ms, pos.end_ms)  # never over recorded time
    run = replace(cfg, start_ms=start_ms, job_id_base=pos.job_id_base + ID_BLOCK)
    behind = max(0, now_ms // 1000 - start_ms // 1000)
    return Restart(run, 0, behind, "the previous plan ran out: a new plan from its end, job ids in a new block")


def position_of(cfg: SimConfig, through_ms: int) -> Position:
    return Position(
        cfg.seed, cfg.nodes, cfg.cluster, cfg.duration_s, cfg.start_ms, cfg.job_id_base, through_ms, cfg.kube_nodes
    )


def load(path: Path) -> Position | None:
    """The saved position; None when there is none or it cannot be read (a fresh start, logged)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Position(**{k: data[k] for k in Position.__dataclass_fields__ if k != "kube_nodes" or k in data})
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("simulator position %s unreadable (%s): starting fresh", path, type(exc).__name__)
        return None


def save(path: Path, pos: Position) -> None:
    """Write atomically (a crash leaves the old position or the new one, never half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(pos), sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)
