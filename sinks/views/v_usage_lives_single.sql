-- Usage rows of ids never reused (one life each) with that life's start: v_usage_lives' first branch.
-- Its month's twin joins only the lives of the ids with usage in the month (v_job_lives_month.sql), for the
-- single-lives reads of one month once the ledger holds many months (web/queries.py MONTH_LIVES_VIEWS):
-- variant: v_usage_lives_month replaces v_job_lives_started with v_job_lives_month(period)
CREATE OR REPLACE VIEW v_usage_lives_single AS
SELECT u.day AS day, u.cluster AS cluster, u.job_id AS job_id, u.user AS user, u.team AS team,
       u.project AS project, u.cost_centre AS cost_centre, u.generation AS generation,
       u.pricing_tier AS pricing_tier, u.preemptible AS preemptible, u.allocated_s AS allocated_s,
       u.active_s AS active_s, u.starved_s AS starved_s, u.idle_s AS idle_s, u.dark_s AS dark_s,
       u.sm_weighted_s AS sm_weighted_s, u.device_minutes AS device_minutes,
       u.gpu_share_slices AS gpu_share_slices, u.gpu_share_of AS gpu_share_of,
       if(u.end_ms > l.job_start_ms, l.job_start_ms, toInt64(0)) AS job_start_ms
FROM
(
-- include: usage_daily_lives
    WHERE job_id != '' AND (cluster, job_id) NOT IN (SELECT cluster, job_id FROM job_ids_reused)
) AS u
ANY LEFT JOIN v_job_lives_started AS l
    ON u.cluster = l.cluster AND u.job_id = l.job_id;
