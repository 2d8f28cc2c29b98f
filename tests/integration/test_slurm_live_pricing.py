"""The policy's tiers set the price, on the live Slurm (issue 38 items 2 and 3).

`gpuledger policy apply --engine slurm` puts the policy's QOS there (tiers prod-S and sweep-S; the preemptible
tier sweep-S at 40% off). Two GPU jobs run at once: `sweep` in QOS sweep-S (account sweep-S) and `prod` in QOS
prod-S (account serve-S). The real producer (`gpuledger slurm poll`, a separate process configured only with
`policy_path`: no `scheduler.preemptible_qos`) publishes their events to the real broker; read back through the
contract, every event carries the uid `id -u` gives for its user and scontrol prints, and only the sweep's is
preemptible. The events (with per-second samples of the node's GPUs) go through the processors' own pipeline
(`run_in_memory`, the pure functions the workers run) into the embedded ClickHouse through the sinks' writer;
`gpuledger ratecard load` takes its discount from the policy and `report chargeback --by project` (the project is
the account here) charges the sweep at the discount and prod at full rate, to the cent, against the cents worked
here from the card's own numbers and the seconds sacct reports.
`policy diff` is clean with the pricing from the policy, and names both disagreements when an explicit
`scheduler.preemptible_qos` prices another QOS (exit 1).

The card makes the arithmetic exact: an H100 of 31,536,000 $ over one year of 8,760 h, nothing else, so
3,600.000000 $/GPU-h (1 $ a GPU-second) and 2,160.000000 $/GPU-h preemptible.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import pwd
import signal
import subprocess
import sys
import time
import uuid
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic
from fixtures_cli import run_gpuledger
from test_chargeback_ledger import cli_env
from test_slurm_live_policy import policy_text

from base.processor_settings import ProcessorSettings
from base.settings import ClickHouseSettings
from processors.pipeline import run_in_memory
from processors.testing import device, scrape
from schemas import topics
from schemas.codec import AvroCodec
from schemas.topics import DEVICE_SAMPLES, INVENTORY, JOB_EVENTS, job_key, node_key
from sinks.db import connect, migrate
from sinks.rows import SINKS
from sinks.writer import LedgerWriter, Origin, Pending
from stack.cards import one_dollar_a_second
from stack.slurm.cluster import NODE, SlurmClient

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"
UUIDS = [f"GPU-{i:08d}-5117-4000-8000-000000000000" for i in range(4)]  # indices 0-1 h100, 2-3 a100
CARD = one_dollar_a_second("live-pricing")  # the preemptible discount is the policy's


def rate_micro(price: str, years: int, hours: int, discount: str = "0") -> int:
    """The card's on-prem rate worked by hand (capex only: no power, no shared infra, all hours billable)."""
    base = (Decimal(price) / (years * hours)).quantize(Decimal("0.000001"), ROUND_HALF_UP)
    return int((base * (1 - Decimal(discount)) / Decimal("0.000001")).quantize(Decimal(1), ROUND_HALF_UP))


def cents(seconds: int, micro: int) -> str:
    return str((Decimal(seconds * micro) / Decimal(3_600_000_000)).quantize(Decimal("0.01"), ROUND_HALF_UP))


def read_events(bootstrap: str, prefix: str, want: set[tuple[str, str]], timeout: float = 60) -> list[dict[str, Any]]:
    """Job events from the broker, decoded with the contract codec, until every (job, type) of `want` is there."""
    codec = AvroCodec()
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4().hex}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": "false"})  # fmt: skip
    consumer.subscribe([prefix + JOB_EVENTS.name])
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and not want <= {(e["job_id"], e["event_type"]) for e in out}:
            for msg in consumer.consume(100, timeout=0.5):
                assert msg.error() is None, msg.error()
                out.append(codec.decode(msg.value(), JOB_EVENTS.subject).record)
    finally:
        consumer.close()
    assert want <= {(e["job_id"], e["event_type"]) for e in out}, sorted((e["job_id"], e["event_type"]) for e in out)
    return out


def inventory_record(cluster: str, ts_ms: int) -> dict[str, Any]:
    devices = [{"uuid": u, "index": i, "model": H100 if i < 2 else A100, "generation": "hopper" if i < 2 else "ampere",
                "mig_profile": None, "mig_instance_id": None} for i, u in enumerate(UUIDS)]  # fmt: skip
    return {"cluster": cluster, "node": NODE, "ts_ms": ts_ms, "source": "static", "devices": devices, "deleted": False}


def through_the_ledger(ch: ClickHouseSettings, cluster: str, events: list[dict[str, Any]],
                       devices: list[dict[str, Any]], node: str = NODE) -> Any:  # fmt: skip
    """The events and per-second samples of the node's `devices` (every second from the first event's minute to
    past the last minute's close) through the processors' own pipeline; its device-minutes and the events written
    into ClickHouse by the sinks' writer (migrated first). Returns the pipeline's result."""
    first = min(e["ts_ms"] for e in events) // 60_000 * 60_000
    last = max(e["ts_ms"] for e in events) + 130_000
    inv = {"cluster": cluster, "node": node, "ts_ms": first - 1, "source": "static", "devices": devices,
           "deleted": False}  # fmt: skip
    records: list[tuple[int, int, Any, bytes, dict[str, Any]]] = [(first - 1, 0, INVENTORY, node_key(cluster, node),
                                                                   inv)]  # fmt: skip
    records += [(e["ts_ms"], 1, JOB_EVENTS, job_key(cluster, e["job_id"]), e) for e in events]
    for sec in range(first // 1000, last // 1000 + 1):
        devs = [device(d["uuid"], d["index"], sm=0.9, fb_mib=9000, model=d["model"]) for d in devices]
        sample = scrape(node, sec * 1000, devs, cluster)
        records.append((sec * 1000, 2, DEVICE_SAMPLES, node_key(cluster, node), sample))
    records.sort(key=lambda r: (r[0], r[1]))
    result = run_in_memory([r[2:] for r in records], ProcessorSettings(realtime=False))
    client = connect(ch)
    migrate(client, ch)
    pending = []
    for subject, rows in ((topics.DEVICE_MINUTES.name, result.device_minutes), (JOB_EVENTS.name, events)):
        for spec in SINKS[subject]:
            pending += [Pending(spec, row, Origin(subject, 0, i)) for i, r in enumerate(rows) for row in spec.rows(r)]
    assert not LedgerWriter(client).write(pending).rejected
    client.close()
    return result


def test_the_preemptible_tier_is_charged_at_the_policys_discount_and_production_at_full_rate(
    slurm: SlurmClient, kafka_bootstrap: str, clickhouse_server: Any, clickhouse_database: str, tmp_path: Path
) -> None:
    s = uuid.uuid4().hex[:6]
    cluster, prefix = f"live-{s}", f"price{s}."
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_text(s))
    card = tmp_path / "card.toml"
    card.write_text(CARD)
    server = clickhouse_server
    ch = ClickHouseSettings(url=server.url, database=clickhouse_database, password=server.password,
                            analyst_password=server.analyst_password)  # fmt: skip
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}, **slurm.env, **cli_env(ch),
           "GPULEDGER_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap, "GPULEDGER_KAFKA__TOPIC_PREFIX": prefix,
           "GPULEDGER_CLUSTER": cluster, "GPULEDGER_POLICY_PATH": str(policy),
           "GPULEDGER_STATE_DIR": str(tmp_path / "state")}  # fmt: skip
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for fut in admin.create_topics([NewTopic(prefix + t.name, 1, 1) for t in (JOB_EVENTS, INVENTORY)]).values():
        fut.result(timeout=30)

    applied = run_gpuledger(["policy", "apply", "--engine", "slurm"], env=env, timeout=120)
    assert applied.returncode == 0, applied.stderr
    diff = run_gpuledger(["policy", "diff", "--engine", "slurm"], env=env, timeout=120)
    assert (diff.returncode, diff.stdout) == (0, "no drift\n"), diff.stderr  # no override: pricing agrees
    override = {**env, "GPULEDGER_SCHEDULER__PREEMPTIBLE_QOS": '["scavenger"]'}  # an explicit override, elsewhere
    diff = run_gpuledger(["policy", "diff", "--engine", "slurm"], env=override, timeout=120)
    assert diff.returncode == 1 and diff.stdout.splitlines() == [
        f"pricing: scheduler.preemptible_qos prices QOS scavenger as preemptible, but the policy's preemptible "
        f"tier sweep-{s} is QOS sweep-{s}",
        f"pricing: QOS sweep-{s} is the policy's preemptible tier sweep-{s}, but scheduler.preemptible_qos "
        "(scavenger) does not price it as preemptible: its jobs are charged full price",
    ], diff.stdout + diff.stderr

    poll_log = tmp_path / "poll.log"
    with open(poll_log, "wb") as log:
        argv = [sys.executable, "-c", "from gpuledger.cli import main; main()", "slurm", "poll", "--interval", "1"]
        poller = subprocess.Popen(argv, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    try:
        common = ("--gres=gpu:h100:1", "--chdir=/tmp")
        sweep = slurm.sbatch(f"--account=sweep-{s}", f"--qos=sweep-{s}", "--requeue", *common,
                             wrap="sleep 12", output=Path("/dev/null")).job_id  # fmt: skip
        prod = slurm.sbatch(f"--account=serve-{s}", f"--qos=prod-{s}", *common, wrap="sleep 12",
                            output=Path("/dev/null")).job_id  # fmt: skip
        assert sweep and prod
        listed = {}
        for job in (sweep, prod):
            assert slurm.wait_for_state(job, "RUNNING", timeout=60) == "RUNNING"
            listed[job] = slurm.show_job(job)["UserId"]  # scontrol's own `name(uid)`
        for job in (sweep, prod):
            assert slurm.wait_for_state(job, "COMPLETED", timeout=60) == "COMPLETED"
        events = read_events(kafka_bootstrap, prefix, {(j, t) for j in (sweep, prod) for t in ("STARTED", "ENDED")})
    finally:
        poller.send_signal(signal.SIGTERM)
        try:
            poller.wait(timeout=30)
        except subprocess.TimeoutExpired:
            poller.kill()
            poller.wait()
    mine = [e for e in events if e["job_id"] in (sweep, prod)]

    # The uid beside every name: what `id -u` says and what Slurm printed, on every event of both jobs.
    user = "root"  # sbatch --uid=<other> fails here: slurmd's spool is in root's 0700 pytest directory
    for e in mine:
        assert (e["user"], e["user_uid"], e["user_source"]) == (user, str(pwd.getpwnam(user).pw_uid), "SCHEDULER"), e
        assert listed[e["job_id"]] == f"{user}({e['user_uid']})"
    id_u = subprocess.run(["id", "-u", user], capture_output=True, text=True, check=True).stdout.strip()
    assert {e["user_uid"] for e in mine} == {id_u}
    # Preemptible from the policy's tier alone (sweep-S is none of the old conventional names).
    assert {(e["job_id"], e["qos"], e["preemptible"]) for e in mine} == {(sweep, f"sweep-{s}", True),
                                                                          (prod, f"prod-{s}", False)}  # fmt: skip

    # Seconds held, as accounting says (sacct Start/End, epoch seconds).
    held_s = {}
    for job in (sweep, prod):
        row = slurm.run("sacct", "-X", "-n", "-P", "-j", job, "-o", "Start,End",
                        env={**slurm.env, "SLURM_TIME_FORMAT": "%s"}).stdout.split()[-1]  # fmt: skip
        start, end = (int(x) for x in row.split("|"))
        held_s[job] = end - start
        started = next(e for e in mine if e["job_id"] == job and e["event_type"] == "STARTED")
        assert started["ts_ms"] == start * 1000 and len(started["allocations"][0]["devices"]) == 1

    result = through_the_ledger(ch, cluster, mine, inventory_record(cluster, 0)["devices"])
    by_job = {j: sum(r["allocated_s"] for r in result.device_minutes if r["job_id"] == j) for j in (sweep, prod)}
    assert by_job == held_s
    flags = {(r["job_id"], r["preemptible"]) for r in result.device_minutes if r["job_id"]}
    assert flags == {(sweep, True), (prod, False)}
    first = min(e["ts_ms"] for e in mine)

    loaded = run_gpuledger(["ratecard", "load", "--card", str(card)], env=env)
    assert loaded.returncode == 0 and "rates loaded" in loaded.stdout, loaded.stderr
    full, pre = rate_micro("31536000", 1, 8760), rate_micro("31536000", 1, 8760, "0.40")
    assert (full, pre) == (3_600_000_000, 2_160_000_000)
    shown = run_gpuledger(["ratecard", "show", "--card", str(card)], env=env)
    assert "3600.000000 x (1 - 0.40) = 2160.000000" in shown.stdout, shown.stdout + shown.stderr

    period = dt.datetime.fromtimestamp(first / 1000, dt.UTC).strftime("%Y-%m")
    report = run_gpuledger(["report", "chargeback", "--period", period, "--by", "project", "--format", "json"],
                           env=env)  # fmt: skip
    assert report.returncode == 0, report.stderr
    lines = {r["line"]: r for r in json.loads(report.stdout)}
    expected = {f"sweep-{s}": cents(held_s[sweep], pre), f"serve-{s}": cents(held_s[prod], full)}
    assert {k: lines[k]["charge"] for k in expected} == expected, lines
    assert Decimal(expected[f"sweep-{s}"]) == Decimal(held_s[sweep]) * Decimal("0.60")  # 40% off, to the cent
    assert Decimal(expected[f"serve-{s}"]) == Decimal(held_s[prod])  # 1 $ a GPU-second
    assert lines["TOTAL"]["charge"] == str(Decimal(expected[f"sweep-{s}"]) + Decimal(expected[f"serve-{s}"]))
    print(f"\nsweep {sweep} (uid {id_u}): {held_s[sweep]} s -> {expected[f'sweep-{s}']}; "
          f"prod {prod}: {held_s[prod]} s -> {expected[f'serve-{s}']}")
