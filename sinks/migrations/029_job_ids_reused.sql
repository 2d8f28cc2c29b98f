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

-- v_job_lives' rows of the reused ids (an id of one life is never `later`).
CREATE OR REPLACE VIEW v_job_lives_reused AS
SELECT cluster, job_id, submit_ms, job_start_ms, job_last_ms,
       row_number() OVER (PARTITION BY cluster, job_id ORDER BY job_start_ms, submit_ms) > 1 AS later
FROM
(
    SELECT cluster, job_id, submit_ms, min(job_start_ms) AS job_start_ms, max(job_last_ms) AS job_last_ms
    FROM job_lives
    WHERE (cluster, job_id) IN (SELECT cluster, job_id FROM job_ids_reused)
    GROUP BY cluster, job_id, submit_ms
    HAVING sum(starts) > 0
);

-- 023's rows: a later life is a reused id's.
CREATE OR REPLACE VIEW v_job_days_shared AS
SELECT DISTINCT cluster, job_id, toDate(fromUnixTimestamp64Milli(job_start_ms, 'UTC')) AS day
FROM v_job_lives_reused
WHERE later;

CREATE OR REPLACE VIEW v_usage_lives AS
SELECT u.day AS day, u.cluster AS cluster, u.job_id AS job_id, u.user AS user, u.team AS team,
       u.project AS project, u.cost_centre AS cost_centre, u.generation AS generation,
       u.pricing_tier AS pricing_tier, u.preemptible AS preemptible, u.allocated_s AS allocated_s,
       u.active_s AS active_s, u.starved_s AS starved_s, u.idle_s AS idle_s, u.dark_s AS dark_s,
       u.sm_weighted_s AS sm_weighted_s, u.device_minutes AS device_minutes,
       u.gpu_share_slices AS gpu_share_slices, u.gpu_share_of AS gpu_share_of,
       if(u.end_ms > l.job_start_ms, l.job_start_ms, toInt64(0)) AS job_start_ms
FROM
(
    SELECT day, cluster, job_id, user, team, project, cost_centre, generation, pricing_tier, preemptible,
           toInt64(allocated_s) AS allocated_s, toInt64(active_s) AS active_s, toInt64(starved_s) AS starved_s,
           toInt64(idle_s) AS idle_s, toInt64(dark_s) AS dark_s, sm_weighted_s,
           toInt64(device_minutes) AS device_minutes, gpu_share_slices, gpu_share_of,
           (toInt64(toUnixTimestamp(toDateTime(day, 'UTC'))) + 86400) * 1000 AS end_ms
    FROM usage_daily
    WHERE job_id != '' AND (cluster, job_id) NOT IN (SELECT cluster, job_id FROM job_ids_reused)
) AS u
ANY LEFT JOIN (SELECT cluster, job_id, job_start_ms FROM job_lives FINAL WHERE starts > 0) AS l
    ON u.cluster = l.cluster AND u.job_id = l.job_id
UNION ALL
SELECT u.day, u.cluster, u.job_id, u.user, u.team, u.project, u.cost_centre, u.generation, u.pricing_tier,
       u.preemptible, u.allocated_s, u.active_s, u.starved_s, u.idle_s, u.dark_s, u.sm_weighted_s, u.device_minutes,
       u.gpu_share_slices, u.gpu_share_of, l.job_start_ms
FROM
(
    SELECT day, cluster, job_id, user, team, project, cost_centre, generation, pricing_tier, preemptible,
           toInt64(allocated_s) AS allocated_s, toInt64(active_s) AS active_s, toInt64(starved_s) AS starved_s,
           toInt64(idle_s) AS idle_s, toInt64(dark_s) AS dark_s, sm_weighted_s,
           toInt64(device_minutes) AS device_minutes, gpu_share_slices, gpu_share_of,
           (toInt64(toUnixTimestamp(toDateTime(day, 'UTC'))) + 86400) * 1000 AS end_ms
    FROM usage_daily
    WHERE job_id != '' AND (cluster, job_id) IN (SELECT cluster, job_id FROM job_ids_reused)
) AS u
ASOF LEFT JOIN v_job_lives_reused AS l
    ON u.cluster = l.cluster AND u.job_id = l.job_id AND u.end_ms > l.job_start_ms
WHERE NOT (l.later AND toDate(fromUnixTimestamp64Milli(l.job_start_ms, 'UTC')) = u.day)
UNION ALL
SELECT d.day, d.cluster, d.job_id, d.user, d.team, d.project, d.cost_centre, d.generation, d.pricing_tier,
       d.preemptible, sum(d.allocated_s), sum(d.active_s), sum(d.starved_s), sum(d.idle_s), sum(d.dark_s),
       sum(d.sm_weighted_s), toInt64(count()), d.gpu_share_slices, d.gpu_share_of, l.job_start_ms
FROM
(
    SELECT day, cluster, job_id, user, team, project, cost_centre, generation, pricing_tier, preemptible,
           toInt64(allocated_s) AS allocated_s, toInt64(active_s) AS active_s, toInt64(starved_s) AS starved_s,
           toInt64(idle_s) AS idle_s, toInt64(dark_s) AS dark_s, sm_weighted_s, gpu_share_slices, gpu_share_of,
           minute_start_ms + 60000 AS end_ms
    FROM device_minutes
    WHERE (SELECT count() FROM v_job_days_shared) > 0
      AND job_id != '' AND (cluster, job_id, day) IN (SELECT cluster, job_id, day FROM v_job_days_shared)
) AS d
ASOF LEFT JOIN (SELECT cluster, job_id, job_start_ms FROM v_job_lives_reused) AS l
    ON d.cluster = l.cluster AND d.job_id = l.job_id AND d.end_ms > l.job_start_ms
GROUP BY d.day, d.cluster, d.job_id, d.user, d.team, d.project, d.cost_centre, d.generation, d.pricing_tier,
         d.preemptible, d.gpu_share_slices, d.gpu_share_of, l.job_start_ms;
