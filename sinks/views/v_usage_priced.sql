-- Notes from migration 023_job_lives_guarded, moved here with the view:
-- 022's job lives at less cost. 022's v_usage_priced evaluated v_job_lives (a grouping of every job event) six
-- times per read, whether or not any id was reused. Measured on a synthetic month (20,000 jobs, 1.2 M
-- device-minutes, a two-core machine shared with other work, so +-30%), a month's v_usage_priced by team:
-- 016's view 70-130 ms; 022 310-510 ms (no id reused), 730-890 ms (200 ids reused on the same day);
-- this migration 270-350 ms and 320-420 ms. Still about three times 016's: the ASOF join of every usage row
-- to its life, and reading job_events at all, remain.
-- * `v_job_lives` numbers each id's lives (`later`: not its first), so a usage_daily row finds its life and
--   whether its day is shared in one ASOF join (its life is a later one that started that day);
-- * the shared days' device-minutes and their lives are read only when some day is shared, and the ceded
--   seconds' lives only when some device-day is contested (020's guard), each a scalar count computed once.
-- Columns and rows are 022's.
--
-- One row per job, day and price: allocation-time quantities with the corrected project and the
-- rate in force that day. Charged on allocation; the idle share priced the same way.
-- Price usage_daily rows as stored, without grouping them first: every quantity and the charge
-- numerator (seconds x rate) are additive, so the views that group (v_chargeback_jobs,
-- v_chargeback, ...) give the same exact sums, and a month for 10,000 GPUs prices in a single
-- scan instead of a 10-key GROUP BY before the joins (about 8x faster).
-- As 014, reading usage_daily plus the ceded seconds as negative rows (seconds are Int64 from here on).
-- As 016, reading v_usage_lives; the ceded seconds of a contested minute belong to the life holding it.
-- As 022; the ceded seconds' lives read only when some device-day is contested.
-- Its single twin, for a month of one life per job id and nothing contested (notes: v_month_single_lives.sql),
-- is this text over v_usage_lives' first branch and without the ceded seconds; the second twin is the same over
-- the lives of one month's ids only (v_job_lives_month.sql), read as v_usage_priced_month_lives(period = '2026-03'):
-- variant: v_usage_priced_single replaces v_usage_lives with v_usage_lives_single, without usage_priced_ceded
-- variant: v_usage_priced_month_lives replaces v_usage_lives with v_usage_lives_month(period), without usage_priced_ceded
-- tests/integration/test_priced_views_single.py compares their rows.
CREATE OR REPLACE VIEW v_usage_priced AS
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
    FROM v_usage_lives
-- include: usage_priced_ceded
) AS u
LEFT JOIN v_project_corrections AS c ON u.cluster = c.cluster AND u.job_id = c.job_id
ASOF LEFT JOIN v_rate_card AS r
    ON u.generation = r.generation AND u.pricing_tier = r.pricing_tier AND u.preemptible = r.preemptible
       AND u.day >= r.effective_from
WHERE u.job_id != '';
