-- The allocated seconds on devices of unknown identity, per day and job, fed on insert (issue 21, item 5: the
-- monthly chargeback at 10,000 GPUs). `report chargeback`'s data-quality line and a statement's close read them;
-- both scanned the month's device_minutes with FINAL for `unidentified:` devices, which the table's key
-- (cluster, node, device_uuid, ...) cannot prune: ~4 s each over a month of 10,000 GPUs on two cores, 9 of the
-- report's 10 s. Such devices are rare (a pod whose GPUs the watcher could not name yet), so this table is small.
-- No FINAL, as for usage_daily: the sinks store a device-minute key once (sinks/writer.py).

CREATE TABLE IF NOT EXISTS unidentified_daily
(
    day Date,
    cluster String,
    job_id String,
    allocated_s SimpleAggregateFunction(sum, UInt64)
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(day)
ORDER BY (day, cluster, job_id);

-- The rows already stored, once.
INSERT INTO unidentified_daily
SELECT day, cluster, job_id, toUInt64(sum(allocated_s))
FROM device_minutes
WHERE startsWith(device_uuid, 'unidentified:')
GROUP BY day, cluster, job_id;

CREATE MATERIALIZED VIEW IF NOT EXISTS unidentified_daily_mv TO unidentified_daily AS
SELECT toDate(fromUnixTimestamp64Milli(minute_start_ms, 'UTC')) AS day, cluster, job_id,
       toUInt64(sum(allocated_s)) AS allocated_s
FROM device_minutes
WHERE startsWith(device_uuid, 'unidentified:')
GROUP BY day, cluster, job_id;
