"""The reconciled view's pure parts: a team's lines across clusters add up to its total, percentages from the
summed seconds; the overlap finding names both jobs."""

from __future__ import annotations

from decimal import Decimal

from sinks.chargeback import ChargebackLine
from sinks.data_quality import JobFacts, figure
from sinks.reconcile import ALL_CLUSTERS, ClusterLine, Overlap, Seconds, add_up, with_team_totals


def line(team: str, cluster: str, *, jobs: int, alloc_s: int, consumed_s: int, dark_s: int, charge: str,
         onprem: str = "0", cloud: str = "0") -> ClusterLine:  # fmt: skip
    h = Decimal(alloc_s) / 3600
    return ClusterLine(cluster, ChargebackLine(
        line=team, jobs=jobs, allocated_gpu_h=h, charge=Decimal(charge), consumed_gpu_h=Decimal(consumed_s) / 3600,
        utilisation_pct=round(100 * consumed_s / alloc_s, 1), active_gpu_h=Decimal(consumed_s) / 3600,
        starved_gpu_h=Decimal(0), idle_gpu_h=Decimal(0), dark_gpu_h=Decimal(dark_s) / 3600, idle_cost=Decimal(0),
        coverage_pct=round(100 * (alloc_s - dark_s) / alloc_s, 1), unpriced_gpu_h=Decimal(0), onprem_gpu_h=h,
        cloud_gpu_h=Decimal(0), onprem_charge=Decimal(onprem), cloud_charge=Decimal(cloud),
    ), Seconds(alloc_s, consumed_s, dark_s))  # fmt: skip


def test_team_total_across_clusters_sums_lines_and_takes_percentages_from_seconds() -> None:
    # nlp on Slurm: 9000 s, 7200 consumed (80.0 %), 1800 dark; on Kubernetes: 1800 s, all consumed (100 %).
    slurm = line("nlp", "slurm-a", jobs=2, alloc_s=9000, consumed_s=7200, dark_s=1800, charge="3.21", onprem="3.21")
    kube = line("nlp", "k8s-b", jobs=1, alloc_s=1800, consumed_s=1800, dark_s=0, charge="0.80", onprem="0.50",
                cloud="0.30")  # fmt: skip
    total = add_up("nlp", [slurm, kube])
    assert total.cluster == ALL_CLUSTERS and total.line.line == "nlp"
    assert (total.line.jobs, total.line.charge, total.line.allocated_gpu_h) == (3, Decimal("4.01"), Decimal(3))
    assert (total.line.onprem_charge, total.line.cloud_charge) == (Decimal("3.71"), Decimal("0.30"))
    # 9000 / 10800 = 83.3 %, not the mean of 80.0 and 100.0 (90.0); coverage 9000 / 10800 = 83.3 %.
    assert total.line.utilisation_pct == 83.3 and total.line.coverage_pct == 83.3
    assert total.seconds == Seconds(10800, 9000, 1800)


def test_each_team_is_followed_by_its_total_and_the_month_total_covers_every_cluster_line() -> None:
    lines = [
        line("vision", "slurm-a", jobs=1, alloc_s=3600, consumed_s=3600, dark_s=0, charge="1.63"),
        line("nlp", "slurm-a", jobs=2, alloc_s=9000, consumed_s=7200, dark_s=1800, charge="3.21"),
        line("vision", "k8s-b", jobs=1, alloc_s=1800, consumed_s=900, dark_s=0, charge="0.82"),
        line("nlp", "k8s-b", jobs=1, alloc_s=1800, consumed_s=1800, dark_s=0, charge="0.80"),
    ]
    grouped, total = with_team_totals(lines)
    assert [(ln.line.line, ln.cluster, str(ln.line.charge)) for ln in grouped] == [
        ("nlp", "k8s-b", "0.80"), ("nlp", "slurm-a", "3.21"), ("nlp", "ALL", "4.01"),
        ("vision", "k8s-b", "0.82"), ("vision", "slurm-a", "1.63"), ("vision", "ALL", "2.45"),
    ]  # fmt: skip
    assert (total.line.line, total.line.charge, total.line.jobs) == ("TOTAL", Decimal("6.46"), 5)
    assert total.line.utilisation_pct == round(100 * 13500 / 16200, 1)  # 83.3
    assert with_team_totals([]) == ((), add_up("TOTAL", []))
    assert add_up("TOTAL", []).line.utilisation_pct == 0.0


def test_the_overlap_finding_names_both_jobs_and_the_one_charged() -> None:
    whole = Overlap("GPU-m", -1, "k8s-b", "nlp/ft-1", "slurm-a", "j2", 0, 60_000, 1770)
    assert whole.text() == ("GPU-m: 1770 s claimed by both slurm-a/j2 and k8s-b/nlp/ft-1; charged once, to "
                            "k8s-b/nlp/ft-1 (started later)")  # fmt: skip
    assert Overlap("GPU-m", 3, "k", "p", "s", "j", 0, 0, 30).text().startswith("GPU-m MIG 3: 30 s claimed by both s/j")


def test_the_data_quality_figure_counts_the_seconds_jobs_ceded_to_another_cluster() -> None:
    # j2 claimed 7200 s, ceded 1770 to a later-started pod of another cluster (charged 5430); ft-1 ceded none.
    jobs = [JobFacts(5430, 1830, 0, 0, 0, "EXPLICIT", False, 1770), JobFacts(1770, 0, 0, 0, 0, "EXPLICIT", False)]
    dq = figure("2026-11", jobs)
    assert (dq.overlap_gpu_h, dq.overlap_jobs) == (Decimal("0.492"), 1)  # 1770 / 3600 = 0.4917
    assert dq.columns()["dq_overlap_gpu_h"] == Decimal("0.492")
    assert dq.text().endswith("; claimed by two clusters at once 0.492 GPU-h, ceded by 1 jobs (charged once)")
    assert "two clusters" not in figure("2026-11", jobs[1:]).text()
