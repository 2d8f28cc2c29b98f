"""Poll-cycle cost of the Slurm producer for 10,000 running GPU jobs: parse + diff + encode.

The squeue document is the real slurmrestd 24.05 / data_parser v0.0.41 record of
tests/fixtures/slurm (job on gpu[1-2] with gres_detail), replicated to N jobs on distinct nodes.
Three cycles are timed, each in CPU seconds of this process (the machine is shared), best of rounds:
- first sight: every job is new (N STARTED events encoded);
- steady: nothing changed (the common case: parse + diff only);
- churn: 5% of the jobs ended (listed COMPLETED) and as many new ones started.
Usage:

    .venv/bin/python bench/slurm_poll.py [--jobs 10000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from producers.devicemap import InMemoryDeviceMap  # noqa: E402
from producers.jobevents import EventContext  # noqa: E402
from producers.slurm import parse_capture  # noqa: E402
from producers.slurm_poller import PollState, step  # noqa: E402
from schemas.codec import AvroCodec  # noqa: E402

FIXTURE = ROOT / "tests/fixtures/slurm/slurmrestd-json/24.05_0.0.41_slurm-job-gpus-multi-nodes.json"
T0 = 1762529688


def make_doc(n: int, first_id: int = 1000, ended: frozenset[int] = frozenset()) -> str:
    doc = json.loads(FIXTURE.read_text())
    base = doc["jobs"][0]
    jobs = []
    for i in range(n):
        job_id = first_id + i
        rec = copy.deepcopy(base)
        rec["job_id"] = job_id
        rec["nodes"] = f"gpu[{2 * job_id}-{2 * job_id + 1}]"
        rec["job_resources"]["nodes"]["list"] = rec["nodes"]
        rec["user_name"] = f"user{job_id % 500}"
        rec["start_time"]["number"] = T0 + i
        if job_id in ended:
            rec["job_state"] = ["COMPLETED"]
            rec["end_time"]["number"] = T0 + 3600
        jobs.append(rec)
    doc["jobs"] = jobs
    return json.dumps(doc)


def timed(fn):
    start = time.process_time()
    out = fn()
    return out, time.process_time() - start


def cycle(state: PollState, text: str, ctx: EventContext, codec: AvroCodec, now_ms: int) -> dict[str, float]:
    capture, t_parse = timed(lambda: parse_capture(text))
    events, t_diff = timed(lambda: step(state, capture.jobs, [], now_ms, ctx))
    _, t_encode = timed(lambda: [codec.encode("sched.job-events", e) for e in events])
    return {"parse": t_parse, "diff": t_diff, "encode": t_encode, "events": float(len(events))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    n = args.jobs
    churn = n // 20
    docs = {
        "first sight": make_doc(n),
        "steady": make_doc(n),
        "churn 5%": make_doc(n, ended=frozenset(range(1000, 1000 + churn))),
    }
    # the churn listing also has `churn` new jobs instead of the ended ones' successors
    churn_doc = json.loads(docs["churn 5%"])
    churn_doc["jobs"] += json.loads(make_doc(churn, first_id=1000 + n))["jobs"]
    docs["churn 5%"] = json.dumps(churn_doc)
    devmap = InMemoryDeviceMap()
    for j in range(1000, 1000 + n + churn):
        for node in (f"gpu{2 * j}", f"gpu{2 * j + 1}"):
            for i in range(4):
                devmap.set("bench", node, i, f"GPU-{node}-{i}")
    ctx = EventContext("bench", devices=devmap)
    codec = AvroCodec()
    best: dict[str, dict[str, float]] = {}
    for _ in range(args.rounds):
        state = PollState()
        for k, (name, text) in enumerate(docs.items()):
            got = cycle(state, text, ctx, codec, T0 * 1000 + 60_000 * (k + 1))
            total = got["parse"] + got["diff"] + got["encode"]
            if name not in best or total < best[name]["total"]:
                best[name] = {**got, "total": total}
    size_mb = len(docs["steady"]) / 1e6
    print(f"Slurm poll cycle, {n} running GPU jobs (2 nodes x 4 GPUs each), squeue JSON {size_mb:.1f} MB;"
          f" CPU seconds, best of {args.rounds}")
    print(f"{'cycle':<12} {'events':>7} {'parse s':>8} {'diff s':>8} {'encode s':>9} {'total s':>8}")
    for name, r in best.items():
        print(f"{name:<12} {int(r['events']):>7} {r['parse']:>8.3f} {r['diff']:>8.3f} {r['encode']:>9.3f}"
              f" {r['total']:>8.3f}")


if __name__ == "__main__":
    main()
