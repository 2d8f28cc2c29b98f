-- Notes from migration 020_contested_claims_guard, moved here with the view:
-- 017's contested claims, read only when some device was claimed by two clusters on one day. Every read of
-- v_usage_priced (each report, statement and web page) evaluated 017's reads of device_minutes and job_events,
-- and the three sets of contested device-days they are filtered by, even with nothing contested (the usual
-- month): about half of a team's v_usage_priced query at 1,000 GPUs (bench/web_page.py, docs/benchmarks.md).
-- Now one count of v_device_days_contested (a scalar subquery, computed once per query) guards both reads: when it
-- is 0 neither runs; otherwise they run exactly as in 017. Columns and rows are 017's in both cases.
--
-- 016's columns, from the claims on devices two clusters held that day, keeping the minutes claimed for
-- more than 60 seconds; each job's start from job_events (only the jobs of those claims). The filter on
-- (cluster, node, device_uuid) is device_minutes' sorting key, so only those devices' granules are read.
CREATE OR REPLACE VIEW v_device_claims_contested AS
SELECT day, device_uuid, mig_instance_id, minute_start_ms, cluster, node, job_id, job_start_ms, generation,
       pricing_tier, preemptible, user, team, project, cost_centre, gpu_share_slices, gpu_share_of, allocated_s,
       active_s, starved_s, idle_s, dark_s
FROM
(
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
        toInt64(d.dark_s) AS dark_s,
        sum(toInt64(d.allocated_s)) OVER (PARTITION BY d.device_uuid, d.mig_instance_id, d.minute_start_ms)
            AS minute_claimed_s
    FROM
    (
        SELECT day, device_uuid, mig_instance_id, minute_start_ms, cluster, node, job_id, generation, pricing_tier,
               preemptible, user, team, project, cost_centre, gpu_share_slices, gpu_share_of, allocated_s, active_s,
               starved_s, idle_s, dark_s
        FROM device_minutes
        WHERE (SELECT count() FROM v_device_days_contested) > 0
          AND (cluster, node, device_uuid) IN (SELECT h.1, h.2, device_uuid FROM v_device_days_contested ARRAY JOIN all_holders AS h)
          AND (day, device_uuid, mig_instance_id) IN (SELECT day, device_uuid, mig_instance_id FROM v_device_days_contested)
          AND job_id != '' AND allocated_s > 0
    ) AS d
    LEFT JOIN
    (
        SELECT cluster, job_id, min(coalesce(start_ts_ms, ts_ms)) AS start_ms
        FROM job_events
        WHERE (SELECT count() FROM v_device_days_contested) > 0
              AND (cluster, job_id) IN (
            SELECT h.1, h.2 FROM v_device_days_contested ARRAY JOIN all_jobs AS h)
        GROUP BY cluster, job_id
    ) AS s ON d.cluster = s.cluster AND d.job_id = s.job_id
)
WHERE minute_claimed_s > 60;
