-- superseded-checksum: 55d9db7f27515029 (this file before its views moved to sinks/views/, one file per view,
-- applied after the migrations on every `gpuledger db migrate`)

-- Job lives only where an id was reused (issue 20, item 6). Every read of v_usage_priced ASOF-joined each usage row
-- to v_job_lives (a window over every life ever recorded) and counted v_job_days_shared (the same window) before
-- reading a row: ~250 of a team's month's ~300 ms at 10,000 GPUs, whatever the filter (the right side of a join
-- and a scalar guard are built before the left side is read). Yet an id with one life needs no ASOF: its rows are
-- that life's. `job_ids_reused` names the ids with two or more started lives, fed on insert; only their rows go
-- through 023's ASOF join and shared-days branch, over their own lives. Rows and columns of v_usage_lives (and so
-- of v_usage_priced) are 023's: an id of one life gets its start by an equi-join, and none (0) for a day that ended
-- before its start, as the ASOF join gave (ANY: one life, even if an id were read between the insert of its
-- second life and its marking).
-- How an id becomes reused: a block of job events with STARTED events of two submit times (the first view), or a
-- STARTED event whose submit time differs from a started life already stored (the second; whether or not
-- job_lives_mv has stored the block's own lives by then, they carry the block's submit times). A job's events
-- share its partition and so one sink, which inserts them in order: two lives of an id are never in two
-- concurrent inserts. A replayed event is checked again. In a materialized view every reference to job_events is
-- the inserted block, so the second view reads job_lives only for the block's ids (its sorting key's prefix): an
-- insert's cost does not grow with the history kept. Marking an id that had one life is harmless (its rows
-- take the general path, which gives them the same start).

CREATE TABLE IF NOT EXISTS job_ids_reused
(
    cluster String,
    job_id String
)
ENGINE = ReplacingMergeTree
ORDER BY (cluster, job_id);

-- The ids already stored, once.
INSERT INTO job_ids_reused
SELECT cluster, job_id FROM job_lives FINAL WHERE starts > 0 GROUP BY cluster, job_id HAVING count() > 1;

CREATE MATERIALIZED VIEW IF NOT EXISTS job_ids_reused_in_block_mv TO job_ids_reused AS
SELECT cluster, job_id
FROM job_events
WHERE event_type = 'STARTED'
GROUP BY cluster, job_id
HAVING uniqExact(ifNull(submit_ts_ms, toInt64(0))) > 1;

CREATE MATERIALIZED VIEW IF NOT EXISTS job_ids_reused_stored_mv TO job_ids_reused AS
SELECT DISTINCT e.cluster AS cluster, e.job_id AS job_id
FROM
(
    SELECT cluster, job_id, ifNull(submit_ts_ms, toInt64(0)) AS submit_ms FROM job_events WHERE event_type = 'STARTED'
) AS e
INNER JOIN
(
    SELECT cluster, job_id, submit_ms FROM job_lives
    WHERE starts > 0 AND (cluster, job_id) IN (SELECT cluster, job_id FROM job_events WHERE event_type = 'STARTED')
) AS l ON e.cluster = l.cluster AND e.job_id = l.job_id
WHERE l.submit_ms != e.submit_ms;
