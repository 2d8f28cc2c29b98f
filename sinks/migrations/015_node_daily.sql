-- A daily rollup per team and node, for the pages' data-quality figures (issue 20, "fast on real
-- volumes"): where a team's allocated time was dark, and how fresh the newest device-minute is. Both
-- used to scan the month's raw device_minutes (hundreds of millions of rows for 10,000 GPUs); this
-- table holds one row per (team, day, cluster, node) and is fed on insert, like usage_daily, from the
-- same device-minutes (the sinks insert a key only once, so the sums are exact). Rows of unallocated
-- telemetry have team '' and dark_s 0 (the table's checks: dark is a class of allocated time).
-- AggregatingMergeTree with simple aggregates: sums add, last_minute_ms keeps the max; read with
-- GROUP BY (merges are lazy). The analyst reads it through the SELECT grant on the whole database
-- (004_analyst_role.sql; the embedded server authorises its analyst on every table of the database).

CREATE TABLE IF NOT EXISTS node_daily
(
    day Date,
    team String,
    cluster String,
    node String,
    device_minutes SimpleAggregateFunction(sum, UInt64),
    unallocated_s SimpleAggregateFunction(sum, UInt64),
    allocated_s SimpleAggregateFunction(sum, UInt64),
    dark_s SimpleAggregateFunction(sum, UInt64),
    last_minute_ms SimpleAggregateFunction(max, Int64) COMMENT 'the newest minute_start_ms of the group'
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(day)
ORDER BY (team, day, cluster, node);

-- The rows already stored, once (the runner applies a migration before the sinks it serves start);
-- then the view carries every later insert.
INSERT INTO node_daily
SELECT
    toDate(fromUnixTimestamp64Milli(minute_start_ms, 'UTC')) AS day,
    team, cluster, node,
    toUInt64(count()) AS device_minutes,
    toUInt64(sum(unallocated_s)) AS unallocated_s,
    toUInt64(sum(allocated_s)) AS allocated_s,
    toUInt64(sum(dark_s)) AS dark_s,
    max(minute_start_ms) AS last_minute_ms
FROM device_minutes
GROUP BY day, team, cluster, node;

CREATE MATERIALIZED VIEW IF NOT EXISTS node_daily_mv TO node_daily AS
SELECT
    toDate(fromUnixTimestamp64Milli(minute_start_ms, 'UTC')) AS day,
    team, cluster, node,
    toUInt64(count()) AS device_minutes,
    toUInt64(sum(unallocated_s)) AS unallocated_s,
    toUInt64(sum(allocated_s)) AS allocated_s,
    toUInt64(sum(dark_s)) AS dark_s,
    max(minute_start_ms) AS last_minute_ms
FROM device_minutes
GROUP BY day, team, cluster, node;
