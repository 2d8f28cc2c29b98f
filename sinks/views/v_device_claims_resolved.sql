-- Notes from migration 016_cluster_reconciliation, moved here with the view:
-- The reconciled view (issue 18, item 5): one ledger over every cluster, each device-second charged once.
--
-- Within one cluster the processors already give a device-second to exactly one job (the node stage sees
-- every allocation of its (cluster, node) partition: processors/attribution.py `owners_by_second`, the
-- later-started allocation holds a doubly booked second). Across clusters they cannot: a node that moves
-- from Slurm to Kubernetes is two partitions, and the Slurm job whose end never arrived keeps claiming the
-- GPU (all dark: its telemetry now arrives under the other cluster) while the pod uses it. The warehouse
-- sees both claims, keyed by the GPU's UUID (unique across clusters), and settles them here with the
-- processors' rule:
--
-- * a device-minute is contested when its claims on one identified device (device_uuid, MIG instance;
--   `unidentified:*` devices are never the same device) add up to more than 60 seconds;
-- * its claims are ranked by when their job started (job_events: the earliest start_ts_ms, else ts_ms; a
--   job with no event ranks first-started), latest first, ties by cluster then job id, descending; each
--   claim keeps what is left of the minute's 60 seconds after the claims ranked before it (`kept_s`) and
--   cedes the rest (`ceded_s`). A device-minute records how many seconds a job held, not which, so the
--   seconds ceded are the minute's excess over 60: exact whenever one claim spans the whole minute (the
--   stale allocation of a moved node), a lower bound on the overlap otherwise;
-- * a ceded second leaves its job's dark seconds first, then idle, starved, active (the seconds another
--   job held are the ones its own telemetry did not cover);
-- * `v_usage_priced`, which every charge, statement and journal reads, subtracts the ceded seconds from
--   the ceding job (additive rows of negative seconds, so every grouping still sums);
-- * `v_device_overlaps` is the data-quality finding: per device and pair of jobs, the holder and the
--   job that ceded, both cluster and job id, the minutes and the seconds ceded.
--
-- `v_chargeback_month_clusters(period)`: the month per (team, cluster), the lines of
-- `report chargeback --by cluster`; the report adds each team's lines into a total across clusters.
--
CREATE OR REPLACE VIEW v_device_claims_resolved AS
SELECT
    *,
    least(allocated_s, greatest(toInt64(0), toInt64(60) - held_before)) AS kept_s,
    allocated_s - kept_s AS ceded_s,
    least(ceded_s, dark_s) AS ceded_dark_s,
    least(ceded_s - ceded_dark_s, idle_s) AS ceded_idle_s,
    least(ceded_s - ceded_dark_s - ceded_idle_s, starved_s) AS ceded_starved_s,
    ceded_s - ceded_dark_s - ceded_idle_s - ceded_starved_s AS ceded_active_s
FROM
(
    SELECT
        *,
        toInt64(sum(allocated_s) OVER (PARTITION BY device_uuid, mig_instance_id, minute_start_ms
            ORDER BY job_start_ms DESC, cluster DESC, job_id DESC
            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)) AS held_before,
        first_value(cluster) OVER (PARTITION BY device_uuid, mig_instance_id, minute_start_ms
            ORDER BY job_start_ms DESC, cluster DESC, job_id DESC
            ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS holder_cluster,
        first_value(job_id) OVER (PARTITION BY device_uuid, mig_instance_id, minute_start_ms
            ORDER BY job_start_ms DESC, cluster DESC, job_id DESC
            ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS holder_job_id
    FROM v_device_claims_contested
);
