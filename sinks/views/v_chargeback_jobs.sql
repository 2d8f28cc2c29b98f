-- Fair units (issue 19, item 5): `v_chargeback_jobs`, the job segments behind `report explain`, keeps the MIG
-- share apart. A job's seconds on a 1g slice (1 of 7) and on a 3g slice (3 of 7) are priced at different
-- rates (migration 014), so they are two segments, each with its share beside its seconds and charge; a whole
-- GPU is 1 of 1, a slice of unknown profile 0 of 1 (unpriced). Every column the view had is unchanged, so the
-- readers that sum over it (quota use, appeal look-ups) give the same totals.
-- As 018, one segment per life of a job id.
CREATE OR REPLACE VIEW v_chargeback_jobs AS
SELECT period, cluster, job_id, job_start_ms, user, team, project, original_project, correction_id, cost_centre,
       generation, pricing_tier, preemptible, gpu_share_slices, gpu_share_of,
       min(day) AS first_day, max(day) AS last_day,
       sum(allocated_s) AS allocated_s, sum(active_s) AS active_s, sum(starved_s) AS starved_s,
       sum(idle_s) AS idle_s, sum(dark_s) AS dark_s, sum(sm_weighted_s) AS sm_weighted_s,
       sum(charge_num) AS charge_num, sum(idle_charge_num) AS idle_charge_num, sum(unpriced_s) AS unpriced_s,
       toDecimal128(intDiv(charge_num + 18000000, 36000000), 2) / 100 AS charge
FROM v_usage_priced
GROUP BY period, cluster, job_id, job_start_ms, user, team, project, original_project, correction_id, cost_centre,
         generation, pricing_tier, preemptible, gpu_share_slices, gpu_share_of;
