-- superseded-checksum: 0341c30e2a5a737a (this file before its views moved to sinks/views/, one file per view,
-- applied after the migrations on every `gpuledger db migrate`)

-- 023's job lives from a rollup fed on insert (issue 20, item 6). Every read of v_usage_priced grouped the whole
-- of job_events into lives twice (the ASOF join's right side and the shared-days guard): 88 ms each for a month
-- of 10,000 GPUs (210 k events, 70 k jobs) on two cores, growing with every month kept. `job_lives` keeps one
-- row per (cluster, job id, submit time) and insert: the earliest start of the events that are STARTED, the
-- latest time any event names, and how many were STARTED; reads merge the rows of a life with GROUP BY (merges
-- are lazy). A block of events with no STARTED for a life gives it the largest Int64 as its start, so the
-- minimum is still the earliest STARTED's, and `starts` keeps 023's rule that a life is one with a STARTED.
-- Columns and rows of v_job_lives are 023's.

CREATE TABLE IF NOT EXISTS job_lives
(
    cluster String,
    job_id String,
    submit_ms Int64,
    job_start_ms SimpleAggregateFunction(min, Int64) COMMENT 'earliest start of a STARTED event of the life',
    job_last_ms SimpleAggregateFunction(max, Int64) COMMENT 'latest ts_ms or end_ts_ms any event names',
    starts SimpleAggregateFunction(sum, UInt64) COMMENT 'STARTED events seen (a replayed event counts again)'
)
ENGINE = AggregatingMergeTree
ORDER BY (cluster, job_id, submit_ms);

-- The events already stored, once.
INSERT INTO job_lives
SELECT cluster, job_id, ifNull(submit_ts_ms, toInt64(0)) AS submit_ms,
       if(countIf(event_type = 'STARTED') > 0, minIf(ifNull(start_ts_ms, ts_ms), event_type = 'STARTED'),
          toInt64(9223372036854775807)) AS job_start_ms,
       max(greatest(ts_ms, ifNull(end_ts_ms, ts_ms))) AS job_last_ms,
       toUInt64(countIf(event_type = 'STARTED')) AS starts
FROM job_events
GROUP BY cluster, job_id, submit_ms;

CREATE MATERIALIZED VIEW IF NOT EXISTS job_lives_mv TO job_lives AS
SELECT cluster, job_id, ifNull(submit_ts_ms, toInt64(0)) AS submit_ms,
       if(countIf(event_type = 'STARTED') > 0, minIf(ifNull(start_ts_ms, ts_ms), event_type = 'STARTED'),
          toInt64(9223372036854775807)) AS job_start_ms,
       max(greatest(ts_ms, ifNull(end_ts_ms, ts_ms))) AS job_last_ms,
       toUInt64(countIf(event_type = 'STARTED')) AS starts
FROM job_events
GROUP BY cluster, job_id, submit_ms;
