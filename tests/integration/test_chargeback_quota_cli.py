"""`report chargeback --quota` on the worked ledger (tests/integration/test_chargeback_ledger.py) in the real
ClickHouse engine: per team and generation, owned-hardware GPU-hours beside the policy's quota hours."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_chargeback_ledger import ledger_settings, run_cli, write_ledger

from base.settings import ClickHouseSettings

pytestmark = pytest.mark.integration
__all__ = ["ledger_settings"]  # the fixture, used by name

POLICY = """\
version: 1
generations:
  hopper: {slurm_gres: h100, kueue_flavor: h100}
  ampere: {slurm_gres: a100, kueue_flavor: a100}
tiers: [{name: normal, priority: 1}]
teams:
  - {name: vision, quota: {hopper: 1}}
  - {name: nlp, quota: {ampere: 1}}
"""


def test_quota_beside_use_per_team_and_generation(ledger_settings: ClickHouseSettings, tmp_path: Path) -> None:
    write_ledger(ledger_settings)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    out = run_cli(ledger_settings, "report", "chargeback", "--period", "2026-11", "--quota", "--policy", str(policy),
                  "--format", "json")  # fmt: skip
    rows = {(r["team"], r["generation"]): r for r in json.loads(out)}
    # vision on owned hopper: j1 2 GPUs x 90 min + j6's 10 November minutes = 11400 s; its cloud jobs (j4, j5)
    # are not in the fleet. Quota 1 GPU x 720 h.
    assert rows[("vision", "hopper")] == {"period": "2026-11", "team": "vision", "generation": "hopper",
                                          "allocated_gpu_h": "3.1667", "quota_gpu_h": "720", "quota_used_pct": 0.4}
    # nlp: j3 2670 s of ampere against 1 GPU; j2's hour of hopper against no hopper quota.
    assert rows[("nlp", "ampere")]["allocated_gpu_h"] == "0.7417" and rows[("nlp", "ampere")]["quota_used_pct"] == 0.1
    assert rows[("nlp", "hopper")]["quota_gpu_h"] == "0" and rows[("nlp", "hopper")]["quota_used_pct"] is None
    assert set(rows) == {("vision", "hopper"), ("nlp", "ampere"), ("nlp", "hopper")}
    plain = json.loads(run_cli(ledger_settings, "report", "chargeback", "--period", "2026-11", "--format", "json"))
    assert "quota_gpu_h" not in plain[0] and plain[-1]["line"] == "TOTAL"  # without --quota: the report as before
