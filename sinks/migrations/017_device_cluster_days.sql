-- The reconciliation of 016 without a scan of every device-minute. 016 found contested device-minutes by
-- grouping all of device_minutes on every read of v_usage_priced (every report): measured 1.9 s instead of
-- 0.3 s for one month's chargeback over 1.44 M device-minutes, growing with the table's whole history.
-- With this migration the cost is fixed (about 50 ms on 1.44 M or 4.32 M device-minutes with nothing
-- contested) plus the contested claims themselves (bench/chargeback_overlap.py, docs/benchmarks.md).
-- Within a cluster the processors never let claims on one device exceed its seconds, so only a device that
-- two clusters claimed on one day can be contested. `device_cluster_days` holds, per day and identified
-- device, the clusters whose jobs claimed it (fed on insert like usage_daily and node_daily: tens of
-- thousands of rows a month for 10,000 GPUs); the contested claims are read from device_minutes for those
-- devices and days only. No FINAL: the sinks store a device-minute key once (sinks/writer.py), which the
-- rollups charged from rely on too, so the claims are the rows that were charged.

CREATE TABLE IF NOT EXISTS device_cluster_days
(
    day Date,
    device_uuid String,
    mig_instance_id Int32,
    holders SimpleAggregateFunction(groupUniqArrayArray, Array(Tuple(String, String)))
        COMMENT '(cluster, node) of every job that claimed the device that day',
    jobs SimpleAggregateFunction(groupUniqArrayArray, Array(Tuple(String, String)))
        COMMENT '(cluster, job_id) of every job that claimed the device that day'
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(day)
ORDER BY (day, device_uuid, mig_instance_id);

-- The rows already stored, once (the runner applies a migration before the sinks it serves start).
INSERT INTO device_cluster_days
SELECT toDate(fromUnixTimestamp64Milli(minute_start_ms, 'UTC')) AS day, device_uuid, mig_instance_id,
       groupUniqArray((cluster, node)) AS holders, groupUniqArray((cluster, job_id)) AS jobs
FROM device_minutes
WHERE job_id != '' AND allocated_s > 0 AND NOT startsWith(device_uuid, 'unidentified:')
GROUP BY day, device_uuid, mig_instance_id;

CREATE MATERIALIZED VIEW IF NOT EXISTS device_cluster_days_mv TO device_cluster_days AS
SELECT toDate(fromUnixTimestamp64Milli(minute_start_ms, 'UTC')) AS day, device_uuid, mig_instance_id,
       groupUniqArray((cluster, node)) AS holders, groupUniqArray((cluster, job_id)) AS jobs
FROM device_minutes
WHERE job_id != '' AND allocated_s > 0 AND NOT startsWith(device_uuid, 'unidentified:')
GROUP BY day, device_uuid, mig_instance_id;

-- The devices two clusters claimed on one day: where 016's contested minutes can be.
CREATE OR REPLACE VIEW v_device_days_contested AS
SELECT day, device_uuid, mig_instance_id, groupUniqArrayArray(holders) AS all_holders,
       groupUniqArrayArray(jobs) AS all_jobs
FROM device_cluster_days
GROUP BY day, device_uuid, mig_instance_id
HAVING length(arrayDistinct(arrayMap(h -> h.1, all_holders))) > 1;

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
        WHERE (cluster, node, device_uuid) IN (SELECT h.1, h.2, device_uuid FROM v_device_days_contested ARRAY JOIN all_holders AS h)
          AND (day, device_uuid, mig_instance_id) IN (SELECT day, device_uuid, mig_instance_id FROM v_device_days_contested)
          AND job_id != '' AND allocated_s > 0
    ) AS d
    LEFT JOIN
    (
        SELECT cluster, job_id, min(coalesce(start_ts_ms, ts_ms)) AS start_ms
        FROM job_events
        WHERE (cluster, job_id) IN (
            SELECT h.1, h.2 FROM v_device_days_contested ARRAY JOIN all_jobs AS h)
        GROUP BY cluster, job_id
    ) AS s ON d.cluster = s.cluster AND d.job_id = s.job_id
)
WHERE minute_claimed_s > 60;
