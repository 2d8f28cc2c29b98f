-- Notes from migration 022_job_lives, moved here with the view:
-- Job identity survives id reuse (issue 18, item 3). A reinstalled Slurm counts from 1 again, a Kubernetes Job
-- deleted and created again keeps its name: one (cluster, job_id) can be two jobs. A job is (cluster, job_id,
-- job_start_ms), the first start of one life of the id. The processors tell lives apart the same way
-- (processors/attribution.py `_new_life`: a STARTED after the job ended, submitted at another time; a requeued
-- job keeps its submit time, so it stays one life).
--
-- * `v_job_lives`: one row per life, from job_events: the events of one submit time (none: one life), the
--   first start among its STARTED events (`job_start_ms`), the last time it names (`job_last_ms`).
-- * `v_job_days_shared`: the days a later life of an id started on. Only there can one usage_daily row
--   (one day, one job id) hold two lives' seconds (lives follow each other: the later starts after the
--   earlier ended).
-- * `v_usage_lives`: usage_daily with the life of every row. A day no later life started on belongs whole to
--   the last life started before the day ended; a shared day is read from its device-minutes (guarded: with
--   no id reused on a day, device_minutes is not read) and each minute goes to the last life started before
--   the minute ended. A minute with no life before it (its job's events never stored) has job_start_ms 0.
-- * `v_usage_priced` (016's, reading v_usage_lives) carries `job_start_ms`; the ceded seconds of a contested
--   minute go to the life holding that minute. `v_chargeback_jobs` (018's) keeps lives apart, so
--   `report explain` shows two jobs that shared an id as two lines, each with its own seconds and charge,
--   and the chargeback lines count them as two jobs. Every other column and every sum is unchanged.
--
CREATE OR REPLACE VIEW v_usage_lives AS
SELECT day, cluster, job_id, user, team, project, cost_centre, generation, pricing_tier, preemptible,
       allocated_s, active_s, starved_s, idle_s, dark_s, sm_weighted_s, device_minutes, gpu_share_slices,
       gpu_share_of, job_start_ms
FROM v_usage_lives_single
UNION ALL
SELECT u.day, u.cluster, u.job_id, u.user, u.team, u.project, u.cost_centre, u.generation, u.pricing_tier,
       u.preemptible, u.allocated_s, u.active_s, u.starved_s, u.idle_s, u.dark_s, u.sm_weighted_s, u.device_minutes,
       u.gpu_share_slices, u.gpu_share_of, l.job_start_ms
FROM
(
-- include: usage_daily_lives
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
