-- Views for analysts and for the CLI reports (the CLI reads these same views, so the two never
-- disagree). Money is exact: rates are integer micro-dollars per GPU-hour; a line's charge is
-- sum(seconds x rate) / 3.6e9 dollars, rounded half-up to the cent once per report line.

CREATE VIEW IF NOT EXISTS v_jobs_current AS
SELECT
    cluster,
    job_id,
    argMax(event_type, (ts_ms, event_id)) AS state,
    max(ts_ms) AS last_event_ms,
    argMax(user, (ts_ms, event_id)) AS user,
    argMax(project, (ts_ms, event_id)) AS project,
    argMax(team, (ts_ms, event_id)) AS team,
    argMax(cost_centre, (ts_ms, event_id)) AS cost_centre,
    argMax(job_name, (ts_ms, event_id)) AS job_name,
    argMax(pricing_tier, (ts_ms, event_id)) AS pricing_tier,
    argMax(preemptible, (ts_ms, event_id)) AS preemptible,
    argMax(gang_size, (ts_ms, event_id)) AS gang_size,
    argMax(allocations, (ts_ms, event_id)) AS allocations,
    min(start_ts_ms) AS start_ts_ms,
    max(end_ts_ms) AS end_ts_ms
FROM job_events FINAL
GROUP BY cluster, job_id;

CREATE VIEW IF NOT EXISTS v_project_corrections AS
SELECT cluster, job_id, latest.1 AS project, latest.2 AS correction_id, latest.3 AS reason, corrections
FROM
(
    SELECT cluster, job_id,
           argMax(tuple(new_project, correction_id, reason), tuple(ts_ms, correction_id)) AS latest,
           count() AS corrections
    FROM attribution_corrections FINAL
    GROUP BY cluster, job_id
);

CREATE VIEW IF NOT EXISTS v_rate_card AS
SELECT generation, pricing_tier, preemptible, effective_from, rate_micro_per_gpu_hour,
       toDecimal64(rate_micro_per_gpu_hour, 6) / 1000000 AS rate_per_gpu_hour, basis, card_version
FROM rate_card FINAL
WHERE loaded_ms = (SELECT max(loaded_ms) FROM rate_card);

-- One row per job, day and price: allocation-time quantities with the corrected project and the
-- rate in force that day. Charged on allocation; the idle share priced the same way.
CREATE VIEW IF NOT EXISTS v_usage_priced AS
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
    r.rate_micro_per_gpu_hour AS rate_micro,
    toInt128(u.allocated_s) * r.rate_micro_per_gpu_hour AS charge_num,
    toInt128(u.idle_s) * r.rate_micro_per_gpu_hour AS idle_charge_num,
    if(r.rate_micro_per_gpu_hour = 0, u.allocated_s, 0) AS unpriced_s
FROM
(
    SELECT day, cluster, job_id, user, team, project, cost_centre, generation, pricing_tier, preemptible,
           sum(allocated_s) AS allocated_s, sum(active_s) AS active_s, sum(starved_s) AS starved_s,
           sum(idle_s) AS idle_s, sum(dark_s) AS dark_s, sum(sm_weighted_s) AS sm_weighted_s,
           sum(device_minutes) AS device_minutes
    FROM usage_daily
    WHERE job_id != ''
    GROUP BY day, cluster, job_id, user, team, project, cost_centre, generation, pricing_tier, preemptible
) AS u
LEFT JOIN v_project_corrections AS c ON u.cluster = c.cluster AND u.job_id = c.job_id
ASOF LEFT JOIN v_rate_card AS r
    ON u.generation = r.generation AND u.pricing_tier = r.pricing_tier AND u.preemptible = r.preemptible
       AND u.day >= r.effective_from;

CREATE VIEW IF NOT EXISTS v_chargeback_jobs AS
SELECT period, cluster, job_id, user, team, project, original_project, correction_id, cost_centre,
       generation, pricing_tier, preemptible,
       min(day) AS first_day, max(day) AS last_day,
       sum(allocated_s) AS allocated_s, sum(active_s) AS active_s, sum(starved_s) AS starved_s,
       sum(idle_s) AS idle_s, sum(dark_s) AS dark_s, sum(sm_weighted_s) AS sm_weighted_s,
       sum(charge_num) AS charge_num, sum(idle_charge_num) AS idle_charge_num, sum(unpriced_s) AS unpriced_s,
       toDecimal128(intDiv(charge_num + 18000000, 36000000), 2) / 100 AS charge
FROM v_usage_priced
GROUP BY period, cluster, job_id, user, team, project, original_project, correction_id, cost_centre,
         generation, pricing_tier, preemptible;

-- The chargeback report: one line per (period, grouping, value). `by` is team, project, user or
-- cost-centre. GPU-hours are rounded half-up to 4 places, money half-up to the cent, per line.
CREATE VIEW IF NOT EXISTS v_chargeback AS
SELECT
    period,
    by,
    line,
    uniqExact(cluster, job_id) AS jobs,
    toDecimal128(intDiv(sum(allocated_s) * 10000 + 1800, 3600), 4) / 10000 AS allocated_gpu_h,
    toDecimal128(intDiv(sum(charge_num) + 18000000, 36000000), 2) / 100 AS charge,
    toDecimal128(intDiv((sum(active_s) + sum(starved_s)) * 10000 + 1800, 3600), 4) / 10000 AS consumed_gpu_h,
    if(sum(allocated_s) = 0, 0, round(100 * (sum(active_s) + sum(starved_s)) / sum(allocated_s), 1)) AS utilisation_pct,
    toDecimal128(intDiv(sum(active_s) * 10000 + 1800, 3600), 4) / 10000 AS active_gpu_h,
    toDecimal128(intDiv(sum(starved_s) * 10000 + 1800, 3600), 4) / 10000 AS starved_gpu_h,
    toDecimal128(intDiv(sum(idle_s) * 10000 + 1800, 3600), 4) / 10000 AS idle_gpu_h,
    toDecimal128(intDiv(sum(dark_s) * 10000 + 1800, 3600), 4) / 10000 AS dark_gpu_h,
    toDecimal128(intDiv(sum(idle_charge_num) + 18000000, 36000000), 2) / 100 AS idle_cost,
    if(sum(allocated_s) = 0, 0, round(100 * (sum(allocated_s) - sum(dark_s)) / sum(allocated_s), 1)) AS coverage_pct,
    toDecimal128(intDiv(sum(unpriced_s) * 10000 + 1800, 3600), 4) / 10000 AS unpriced_gpu_h,
    toInt128(sum(allocated_s)) AS allocated_seconds,
    toInt128(sum(active_s)) AS active_seconds,
    toInt128(sum(starved_s)) AS starved_seconds,
    toInt128(sum(idle_s)) AS idle_seconds,
    toInt128(sum(dark_s)) AS dark_seconds,
    sum(charge_num) AS charge_numerator,
    sum(idle_charge_num) AS idle_charge_numerator
FROM
(
    SELECT period, cluster, job_id, allocated_s, active_s, starved_s, idle_s, dark_s, charge_num,
           idle_charge_num, unpriced_s, pair.1 AS by, pair.2 AS line
    FROM v_usage_priced
    ARRAY JOIN [('team', team), ('project', project), ('user', user), ('cost-centre', cost_centre)] AS pair
)
GROUP BY period, by, line;

-- Finance journal: one debit line per cost centre and period (charged on allocation).
CREATE VIEW IF NOT EXISTS v_finance_journal AS
SELECT period, line AS cost_centre, jobs, allocated_gpu_h, charge, idle_cost
FROM v_chargeback
WHERE by = 'cost-centre';

CREATE VIEW IF NOT EXISTS v_utilisation_daily AS
SELECT day, cluster, team, project, generation,
       sum(allocated_s) / 3600 AS allocated_gpu_h,
       (sum(active_s) + sum(starved_s)) / 3600 AS consumed_gpu_h,
       sum(sm_weighted_s) / 3600 AS effective_gpu_h,
       if(sum(allocated_s) = 0, 0, (sum(active_s) + sum(starved_s)) / sum(allocated_s)) AS utilisation
FROM v_usage_priced
GROUP BY day, cluster, team, project, generation;

CREATE VIEW IF NOT EXISTS v_idle_time_monthly AS
SELECT period, cluster, team, project,
       sum(active_s) / 3600 AS active_gpu_h,
       sum(starved_s) / 3600 AS starved_gpu_h,
       sum(idle_s) / 3600 AS idle_gpu_h,
       sum(dark_s) / 3600 AS dark_gpu_h,
       toDecimal128(intDiv(sum(idle_charge_num) + 18000000, 36000000), 2) / 100 AS idle_cost
FROM v_usage_priced
GROUP BY period, cluster, team, project;

CREATE VIEW IF NOT EXISTS v_coverage_daily AS
SELECT day, cluster,
       sum(expected_device_s) AS expected_s,
       sum(reporting_device_s) AS reporting_s,
       if(expected_s = 0, 100, round(100 * reporting_s / expected_s, 2)) AS coverage_pct,
       sum(unexpected_device_minutes) AS unexpected_device_minutes
FROM coverage_daily
GROUP BY day, cluster;
