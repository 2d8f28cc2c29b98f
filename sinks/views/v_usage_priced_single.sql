-- v_usage_priced.sql for a month of one life per job id, nothing contested (notes: v_month_single_lives.sql);
-- a change to v_usage_priced is made here too.
CREATE OR REPLACE VIEW v_usage_priced_single AS
SELECT
    u.day AS day,
    formatDateTime(u.day, '%Y-%m') AS period,
    u.cluster AS cluster,
    u.job_id AS job_id,
    u.user AS user,
    u.team AS team,
    if(c.job_id = '', u.project, c.project) AS project,
    u.project AS original_project,
    c.correction_id AS correction_id,
    u.cost_centre AS cost_centre,
    u.generation AS generation,
    u.pricing_tier AS pricing_tier,
    u.preemptible AS preemptible,
    u.allocated_s AS allocated_s,
    u.active_s AS active_s,
    u.starved_s AS starved_s,
    u.idle_s AS idle_s,
    u.dark_s AS dark_s,
    u.sm_weighted_s AS sm_weighted_s,
    u.device_minutes AS device_minutes,
    u.gpu_share_slices AS gpu_share_slices,
    u.gpu_share_of AS gpu_share_of,
    intDiv(toUInt64(r.rate_micro_per_gpu_hour) * u.gpu_share_slices * 2 + u.gpu_share_of, 2 * u.gpu_share_of)
        AS rate_micro,
    toInt128(u.allocated_s) * rate_micro AS charge_num,
    toInt128(u.idle_s) * rate_micro AS idle_charge_num,
    if(rate_micro = 0, u.allocated_s, 0) AS unpriced_s,
    u.job_start_ms AS job_start_ms
FROM
(
    SELECT day, cluster, job_id, user, team, project, cost_centre, generation, pricing_tier, preemptible,
           allocated_s, active_s, starved_s, idle_s, dark_s, sm_weighted_s, device_minutes, gpu_share_slices,
           gpu_share_of, job_start_ms
    FROM v_usage_lives_single
) AS u
LEFT JOIN v_project_corrections AS c ON u.cluster = c.cluster AND u.job_id = c.job_id
ASOF LEFT JOIN v_rate_card AS r
    ON u.generation = r.generation AND u.pricing_tier = r.pricing_tier AND u.preemptible = r.preemptible
       AND u.day >= r.effective_from
WHERE u.job_id != '';
