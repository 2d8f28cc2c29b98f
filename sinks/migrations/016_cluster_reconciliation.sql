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

CREATE OR REPLACE VIEW v_device_claims_contested AS
SELECT
    d.day AS day,
    d.device_uuid AS device_uuid,
    d.mig_instance_id AS mig_instance_id,
    d.minute_start_ms AS minute_start_ms,
    d.cluster AS cluster,
    d.node AS node,
    d.job_id AS job_id,
    if(s.job_id = '', toInt64(0), s.start_ms) AS job_start_ms,
    d.generation AS generation,
    d.pricing_tier AS pricing_tier,
    d.preemptible AS preemptible,
    d.user AS user,
    d.team AS team,
    d.project AS project,
    d.cost_centre AS cost_centre,
    d.gpu_share_slices AS gpu_share_slices,
    d.gpu_share_of AS gpu_share_of,
    toInt64(d.allocated_s) AS allocated_s,
    toInt64(d.active_s) AS active_s,
    toInt64(d.starved_s) AS starved_s,
    toInt64(d.idle_s) AS idle_s,
    toInt64(d.dark_s) AS dark_s
FROM device_minutes AS d FINAL
INNER JOIN
(
    SELECT day, device_uuid, mig_instance_id, minute_start_ms
    FROM device_minutes FINAL
    WHERE job_id != '' AND NOT startsWith(device_uuid, 'unidentified:')
    GROUP BY day, device_uuid, mig_instance_id, minute_start_ms
    HAVING sum(allocated_s) > 60
) AS c
    ON d.day = c.day AND d.device_uuid = c.device_uuid AND d.mig_instance_id = c.mig_instance_id
       AND d.minute_start_ms = c.minute_start_ms
LEFT JOIN
(
    SELECT cluster, job_id, min(coalesce(start_ts_ms, ts_ms)) AS start_ms
    FROM job_events FINAL
    GROUP BY cluster, job_id
) AS s ON d.cluster = s.cluster AND d.job_id = s.job_id
WHERE d.job_id != '' AND d.allocated_s > 0;

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

CREATE OR REPLACE VIEW v_device_overlaps AS
SELECT
    formatDateTime(day, '%Y-%m') AS period,
    device_uuid,
    mig_instance_id,
    holder_cluster,
    holder_job_id,
    cluster AS ceded_cluster,
    job_id AS ceded_job_id,
    min(minute_start_ms) AS first_minute_ms,
    max(minute_start_ms) AS last_minute_ms,
    toInt64(sum(ceded_s)) AS overlap_s
FROM v_device_claims_resolved
WHERE ceded_s > 0
GROUP BY period, device_uuid, mig_instance_id, holder_cluster, holder_job_id, ceded_cluster, ceded_job_id;

-- As 014, reading usage_daily plus the ceded seconds as negative rows (seconds are Int64 from here on).
CREATE OR REPLACE VIEW v_usage_priced AS
SELECT
    u.day AS day,
    formatDateTime(u.day, '%Y-%m') AS period,
    u.cluster AS cluster,
    u.job_id AS job_id,
    u.user AS user,
    u.team AS team,
    if(c.job_id = '', u.project, c.project) AS project,
    u.project AS original_project,
    c.correction_id AS correction_id,
    u.cost_centre AS cost_centre,
    u.generation AS generation,
    u.pricing_tier AS pricing_tier,
    u.preemptible AS preemptible,
    u.allocated_s AS allocated_s,
    u.active_s AS active_s,
    u.starved_s AS starved_s,
    u.idle_s AS idle_s,
    u.dark_s AS dark_s,
    u.sm_weighted_s AS sm_weighted_s,
    u.device_minutes AS device_minutes,
    u.gpu_share_slices AS gpu_share_slices,
    u.gpu_share_of AS gpu_share_of,
    intDiv(toUInt64(r.rate_micro_per_gpu_hour) * u.gpu_share_slices * 2 + u.gpu_share_of, 2 * u.gpu_share_of)
        AS rate_micro,
    toInt128(u.allocated_s) * rate_micro AS charge_num,
    toInt128(u.idle_s) * rate_micro AS idle_charge_num,
    if(rate_micro = 0, u.allocated_s, 0) AS unpriced_s
FROM
(
    SELECT day, cluster, job_id, user, team, project, cost_centre, generation, pricing_tier, preemptible,
           toInt64(allocated_s) AS allocated_s, toInt64(active_s) AS active_s, toInt64(starved_s) AS starved_s,
           toInt64(idle_s) AS idle_s, toInt64(dark_s) AS dark_s, sm_weighted_s, toInt64(device_minutes) AS device_minutes,
           gpu_share_slices, gpu_share_of
    FROM usage_daily
    UNION ALL
    SELECT day, cluster, job_id, user, team, project, cost_centre, generation, pricing_tier, preemptible,
           -ceded_s, -ceded_active_s, -ceded_starved_s, -ceded_idle_s, -ceded_dark_s, toFloat64(0), toInt64(0),
           gpu_share_slices, gpu_share_of
    FROM v_device_claims_resolved
    WHERE ceded_s > 0
) AS u
LEFT JOIN v_project_corrections AS c ON u.cluster = c.cluster AND u.job_id = c.job_id
ASOF LEFT JOIN v_rate_card AS r
    ON u.generation = r.generation AND u.pricing_tier = r.pricing_tier AND u.preemptible = r.preemptible
       AND u.day >= r.effective_from
WHERE u.job_id != '';

-- v_chargeback_month's columns, one line per (team, cluster); the cents allocated over the month's lines.
CREATE OR REPLACE VIEW v_chargeback_month_clusters AS
SELECT
    period, team, cluster, jobs,
    toDecimal128(intDiv(alloc_s * 10000 + 1800, 3600), 4) / 10000 AS allocated_gpu_h,
    toDecimal128(floor_cents + if(cent_rank <= leftover_cents, 1, 0), 2) / 100 AS charge,
    toDecimal128(intDiv((act_s + starv_s) * 10000 + 1800, 3600), 4) / 10000 AS consumed_gpu_h,
    if(alloc_s = 0, 0, round(100 * (act_s + starv_s) / alloc_s, 1)) AS utilisation_pct,
    toDecimal128(intDiv(act_s * 10000 + 1800, 3600), 4) / 10000 AS active_gpu_h,
    toDecimal128(intDiv(starv_s * 10000 + 1800, 3600), 4) / 10000 AS starved_gpu_h,
    toDecimal128(intDiv(idl_s * 10000 + 1800, 3600), 4) / 10000 AS idle_gpu_h,
    toDecimal128(intDiv(drk_s * 10000 + 1800, 3600), 4) / 10000 AS dark_gpu_h,
    toDecimal128(intDiv(idle_num + 18000000, 36000000), 2) / 100 AS idle_cost,
    if(alloc_s = 0, 0, round(100 * (alloc_s - drk_s) / alloc_s, 1)) AS coverage_pct,
    toDecimal128(intDiv(unpriced * 10000 + 1800, 3600), 4) / 10000 AS unpriced_gpu_h,
    toDecimal128(intDiv(onprem_s * 10000 + 1800, 3600), 4) / 10000 AS onprem_gpu_h,
    toDecimal128(intDiv((alloc_s - onprem_s) * 10000 + 1800, 3600), 4) / 10000 AS cloud_gpu_h,
    multiIf(alloc_s = onprem_s, toDecimal128(0, 2),
            onprem_s = 0, toDecimal128(floor_cents + if(cent_rank <= leftover_cents, 1, 0), 2) / 100,
            toDecimal128(intDiv(num - onprem_num + 18000000, 36000000), 2) / 100) AS cloud_charge,
    toDecimal128(floor_cents + if(cent_rank <= leftover_cents, 1, 0), 2) / 100 - cloud_charge AS onprem_charge,
    alloc_s AS allocated_seconds,
    act_s AS active_seconds,
    starv_s AS starved_seconds,
    idl_s AS idle_seconds,
    drk_s AS dark_seconds,
    num AS charge_numerator,
    idle_num AS idle_charge_numerator
FROM
(
    SELECT *,
           intDiv(num, 36000000) AS floor_cents,
           row_number() OVER (ORDER BY num % 36000000 DESC, team, cluster) AS cent_rank,
           intDiv(sum(num) OVER () + 18000000, 36000000) - sum(intDiv(num, 36000000)) OVER () AS leftover_cents
    FROM
    (
        SELECT {period:String} AS period, team, cluster,
               uniqExact(cluster, job_id) AS jobs,
               toInt128(sum(allocated_s)) AS alloc_s,
               toInt128(sum(active_s)) AS act_s,
               toInt128(sum(starved_s)) AS starv_s,
               toInt128(sum(idle_s)) AS idl_s,
               toInt128(sum(dark_s)) AS drk_s,
               toInt128(sum(unpriced_s)) AS unpriced,
               toInt128(sumIf(allocated_s, pricing_tier = 'on-prem')) AS onprem_s,
               sumIf(charge_num, pricing_tier = 'on-prem') AS onprem_num,
               sum(charge_num) AS num,
               sum(idle_charge_num) AS idle_num
        FROM v_usage_priced
        WHERE day >= toDate(concat({period:String}, '-01'))
          AND day < addMonths(toDate(concat({period:String}, '-01')), 1)
        GROUP BY team, cluster
    )
);
