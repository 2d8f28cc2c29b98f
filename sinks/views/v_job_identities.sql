-- One row per life of a job (022's lives: one submit time of an id, with a STARTED event), keyed as
-- v_chargeback_jobs' rows are: (cluster, job_id, job_start_ms). The latest non-null of each identity column (a
-- later event that lacks one keeps the earlier's); `report explain`, the job page and the data-quality figure
-- read it beside the charges.
CREATE OR REPLACE VIEW v_job_identities AS
SELECT cluster, job_id, ifNull(submit_ts_ms, toInt64(0)) AS submit_ms,
       minIf(ifNull(start_ts_ms, ts_ms), event_type = 'STARTED') AS job_start_ms,
       argMax(user, (ts_ms, event_id)) AS user,
       argMax(user_uid, (ts_ms, event_id)) AS user_uid,
       argMax(user_source, (ts_ms, event_id)) AS user_source,
       argMax(user_claimed, (ts_ms, event_id)) AS user_claimed,
       argMax(user_groups, (ts_ms, event_id)) AS user_groups
FROM job_events
GROUP BY cluster, job_id, submit_ms
HAVING countIf(event_type = 'STARTED') > 0;
