-- superseded-checksum: 8e7e7b91291b1358 (this file before its views moved to sinks/views/, one file per view,
-- applied after the migrations on every `gpuledger db migrate`)

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
