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

CREATE OR REPLACE VIEW v_job_lives AS
SELECT cluster, job_id, ifNull(submit_ts_ms, toInt64(0)) AS submit_ms,
       minIf(ifNull(start_ts_ms, ts_ms), event_type = 'STARTED') AS job_start_ms,
       max(greatest(ts_ms, ifNull(end_ts_ms, ts_ms))) AS job_last_ms
FROM job_events
GROUP BY cluster, job_id, submit_ms
HAVING countIf(event_type = 'STARTED') > 0;

CREATE OR REPLACE VIEW v_job_days_shared AS
SELECT DISTINCT cluster, job_id, toDate(fromUnixTimestamp64Milli(job_start_ms, 'UTC')) AS day
FROM
(
    SELECT cluster, job_id, job_start_ms,
           row_number() OVER (PARTITION BY cluster, job_id ORDER BY job_start_ms, submit_ms) AS life
    FROM v_job_lives
)
WHERE life > 1;

CREATE OR REPLACE VIEW v_usage_lives AS
SELECT u.day AS day, u.cluster AS cluster, u.job_id AS job_id, u.user AS user, u.team AS team,
       u.project AS project, u.cost_centre AS cost_centre, u.generation AS generation,
       u.pricing_tier AS pricing_tier, u.preemptible AS preemptible, u.allocated_s AS allocated_s,
       u.active_s AS active_s, u.starved_s AS starved_s, u.idle_s AS idle_s, u.dark_s AS dark_s,
       u.sm_weighted_s AS sm_weighted_s, u.device_minutes AS device_minutes,
       u.gpu_share_slices AS gpu_share_slices, u.gpu_share_of AS gpu_share_of, l.job_start_ms AS job_start_ms
FROM
(
    SELECT day, cluster, job_id, user, team, project, cost_centre, generation, pricing_tier, preemptible,
           toInt64(allocated_s) AS allocated_s, toInt64(active_s) AS active_s, toInt64(starved_s) AS starved_s,
           toInt64(idle_s) AS idle_s, toInt64(dark_s) AS dark_s, sm_weighted_s,
           toInt64(device_minutes) AS device_minutes, gpu_share_slices, gpu_share_of,
           (toInt64(toUnixTimestamp(toDateTime(day, 'UTC'))) + 86400) * 1000 AS end_ms
    FROM usage_daily
    WHERE job_id != '' AND (cluster, job_id, day) NOT IN (SELECT cluster, job_id, day FROM v_job_days_shared)
) AS u
ASOF LEFT JOIN v_job_lives AS l ON u.cluster = l.cluster AND u.job_id = l.job_id AND u.end_ms > l.job_start_ms
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
ASOF LEFT JOIN v_job_lives AS l ON d.cluster = l.cluster AND d.job_id = l.job_id AND d.end_ms > l.job_start_ms
GROUP BY d.day, d.cluster, d.job_id, d.user, d.team, d.project, d.cost_centre, d.generation, d.pricing_tier,
         d.preemptible, d.gpu_share_slices, d.gpu_share_of, l.job_start_ms;

-- As 016, reading v_usage_lives; the ceded seconds of a contested minute belong to the life holding it.
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
    UNION ALL
    SELECT x.day, x.cluster, x.job_id, x.user, x.team, x.project, x.cost_centre, x.generation, x.pricing_tier,
           x.preemptible, -x.ceded_s, -x.ceded_active_s, -x.ceded_starved_s, -x.ceded_idle_s, -x.ceded_dark_s,
           toFloat64(0), toInt64(0), x.gpu_share_slices, x.gpu_share_of, l.job_start_ms
    FROM
    (
        SELECT *, minute_start_ms + 60000 AS end_ms FROM v_device_claims_resolved WHERE ceded_s > 0
    ) AS x
    ASOF LEFT JOIN v_job_lives AS l ON x.cluster = l.cluster AND x.job_id = l.job_id AND x.end_ms > l.job_start_ms
) AS u
LEFT JOIN v_project_corrections AS c ON u.cluster = c.cluster AND u.job_id = c.job_id
ASOF LEFT JOIN v_rate_card AS r
    ON u.generation = r.generation AND u.pricing_tier = r.pricing_tier AND u.preemptible = r.preemptible
       AND u.day >= r.effective_from
WHERE u.job_id != '';

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

-- The chargeback lines count jobs, not job ids: 014's v_chargeback and v_chargeback_month and 016's
-- v_chargeback_month_clusters, with `jobs` = uniqExact(cluster, job_id, job_start_ms); nothing else changed.
CREATE OR REPLACE VIEW v_chargeback AS
SELECT
    period, by, line, jobs,
    toDecimal128(intDiv(alloc_s * 10000 + 1800, 3600), 4) / 10000 AS allocated_gpu_h,
    toDecimal128(floor_cents + if(cent_rank <= leftover_cents, 1, 0), 2) / 100 AS charge,
    toDecimal128(intDiv((act_s + starv_s) * 10000 + 1800, 3600), 4) / 10000 AS consumed_gpu_h,
    if(alloc_s = 0, 0, round(100 * (act_s + starv_s) / alloc_s, 1)) AS utilisation_pct,
    toDecimal128(intDiv(act_s * 10000 + 1800, 3600), 4) / 10000 AS active_gpu_h,
    toDecimal128(intDiv(starv_s * 10000 + 1800, 3600), 4) / 10000 AS starved_gpu_h,
    toDecimal128(intDiv(idl_s * 10000 + 1800, 3600), 4) / 10000 AS idle_gpu_h,
    toDecimal128(intDiv(drk_s * 10000 + 1800, 3600), 4) / 10000 AS dark_gpu_h,
    toDecimal128(intDiv(idle_num + 18000000, 36000000), 2) / 100 AS idle_cost,
    if(alloc_s = 0, 0, round(100 * (alloc_s - drk_s) / alloc_s, 1)) AS coverage_pct,
    toDecimal128(intDiv(unpriced * 10000 + 1800, 3600), 4) / 10000 AS unpriced_gpu_h,
    toDecimal128(intDiv(onprem_s * 10000 + 1800, 3600), 4) / 10000 AS onprem_gpu_h,
    toDecimal128(intDiv((alloc_s - onprem_s) * 10000 + 1800, 3600), 4) / 10000 AS cloud_gpu_h,
    multiIf(alloc_s = onprem_s, toDecimal128(0, 2),
            onprem_s = 0, toDecimal128(floor_cents + if(cent_rank <= leftover_cents, 1, 0), 2) / 100,
            toDecimal128(intDiv(num - onprem_num + 18000000, 36000000), 2) / 100) AS cloud_charge,
    toDecimal128(floor_cents + if(cent_rank <= leftover_cents, 1, 0), 2) / 100 - cloud_charge AS onprem_charge,
    alloc_s AS allocated_seconds,
    act_s AS active_seconds,
    starv_s AS starved_seconds,
    idl_s AS idle_seconds,
    drk_s AS dark_seconds,
    num AS charge_numerator,
    idle_num AS idle_charge_numerator
FROM
(
    SELECT *,
           intDiv(num, 36000000) AS floor_cents,
           row_number() OVER (PARTITION BY period, by ORDER BY num % 36000000 DESC, line) AS cent_rank,
           intDiv(sum(num) OVER (PARTITION BY period, by) + 18000000, 36000000)
               - sum(intDiv(num, 36000000)) OVER (PARTITION BY period, by) AS leftover_cents
    FROM
    (
        SELECT period, by, line,
               uniqExact(cluster, job_id, job_start_ms) AS jobs,
               toInt128(sum(allocated_s)) AS alloc_s,
               toInt128(sum(active_s)) AS act_s,
               toInt128(sum(starved_s)) AS starv_s,
               toInt128(sum(idle_s)) AS idl_s,
               toInt128(sum(dark_s)) AS drk_s,
               toInt128(sum(unpriced_s)) AS unpriced,
               toInt128(sumIf(allocated_s, pricing_tier = 'on-prem')) AS onprem_s,
               sumIf(charge_num, pricing_tier = 'on-prem') AS onprem_num,
               sum(charge_num) AS num,
               sum(idle_charge_num) AS idle_num
        FROM
        (
            SELECT period, cluster, job_id, job_start_ms, pricing_tier, allocated_s, active_s, starved_s, idle_s,
                   dark_s, charge_num,
                   idle_charge_num, unpriced_s, pair.1 AS by, pair.2 AS line
            FROM v_usage_priced
            ARRAY JOIN [('team', team), ('project', project), ('user', user), ('cost-centre', cost_centre),
                        ('tier', pricing_tier)] AS pair
        )
        GROUP BY period, by, line
    )
);

CREATE OR REPLACE VIEW v_chargeback_month AS
SELECT
    period, by, line, jobs,
    toDecimal128(intDiv(alloc_s * 10000 + 1800, 3600), 4) / 10000 AS allocated_gpu_h,
    toDecimal128(floor_cents + if(cent_rank <= leftover_cents, 1, 0), 2) / 100 AS charge,
    toDecimal128(intDiv((act_s + starv_s) * 10000 + 1800, 3600), 4) / 10000 AS consumed_gpu_h,
    if(alloc_s = 0, 0, round(100 * (act_s + starv_s) / alloc_s, 1)) AS utilisation_pct,
    toDecimal128(intDiv(act_s * 10000 + 1800, 3600), 4) / 10000 AS active_gpu_h,
    toDecimal128(intDiv(starv_s * 10000 + 1800, 3600), 4) / 10000 AS starved_gpu_h,
    toDecimal128(intDiv(idl_s * 10000 + 1800, 3600), 4) / 10000 AS idle_gpu_h,
    toDecimal128(intDiv(drk_s * 10000 + 1800, 3600), 4) / 10000 AS dark_gpu_h,
    toDecimal128(intDiv(idle_num + 18000000, 36000000), 2) / 100 AS idle_cost,
    if(alloc_s = 0, 0, round(100 * (alloc_s - drk_s) / alloc_s, 1)) AS coverage_pct,
    toDecimal128(intDiv(unpriced * 10000 + 1800, 3600), 4) / 10000 AS unpriced_gpu_h,
    toDecimal128(intDiv(onprem_s * 10000 + 1800, 3600), 4) / 10000 AS onprem_gpu_h,
    toDecimal128(intDiv((alloc_s - onprem_s) * 10000 + 1800, 3600), 4) / 10000 AS cloud_gpu_h,
    multiIf(alloc_s = onprem_s, toDecimal128(0, 2),
            onprem_s = 0, toDecimal128(floor_cents + if(cent_rank <= leftover_cents, 1, 0), 2) / 100,
            toDecimal128(intDiv(num - onprem_num + 18000000, 36000000), 2) / 100) AS cloud_charge,
    toDecimal128(floor_cents + if(cent_rank <= leftover_cents, 1, 0), 2) / 100 - cloud_charge AS onprem_charge,
    alloc_s AS allocated_seconds,
    act_s AS active_seconds,
    starv_s AS starved_seconds,
    idl_s AS idle_seconds,
    drk_s AS dark_seconds,
    num AS charge_numerator,
    idle_num AS idle_charge_numerator
FROM
(
    SELECT *,
           intDiv(num, 36000000) AS floor_cents,
           row_number() OVER (ORDER BY num % 36000000 DESC, line) AS cent_rank,
           intDiv(sum(num) OVER () + 18000000, 36000000) - sum(intDiv(num, 36000000)) OVER () AS leftover_cents
    FROM
    (
        SELECT {period:String} AS period, {by:String} AS by,
               multiIf({by:String} = 'team', team, {by:String} = 'project', project,
                       {by:String} = 'user', user, {by:String} = 'tier', pricing_tier, cost_centre) AS line,
               uniqExact(cluster, job_id, job_start_ms) AS jobs,
               toInt128(sum(allocated_s)) AS alloc_s,
               toInt128(sum(active_s)) AS act_s,
               toInt128(sum(starved_s)) AS starv_s,
               toInt128(sum(idle_s)) AS idl_s,
               toInt128(sum(dark_s)) AS drk_s,
               toInt128(sum(unpriced_s)) AS unpriced,
               toInt128(sumIf(allocated_s, pricing_tier = 'on-prem')) AS onprem_s,
               sumIf(charge_num, pricing_tier = 'on-prem') AS onprem_num,
               sum(charge_num) AS num,
               sum(idle_charge_num) AS idle_num
        FROM v_usage_priced
        WHERE day >= toDate(concat({period:String}, '-01'))
          AND day < addMonths(toDate(concat({period:String}, '-01')), 1)
        GROUP BY line
    )
);

CREATE OR REPLACE VIEW v_chargeback_month_clusters AS
SELECT
    period, team, cluster, jobs,
    toDecimal128(intDiv(alloc_s * 10000 + 1800, 3600), 4) / 10000 AS allocated_gpu_h,
    toDecimal128(floor_cents + if(cent_rank <= leftover_cents, 1, 0), 2) / 100 AS charge,
    toDecimal128(intDiv((act_s + starv_s) * 10000 + 1800, 3600), 4) / 10000 AS consumed_gpu_h,
    if(alloc_s = 0, 0, round(100 * (act_s + starv_s) / alloc_s, 1)) AS utilisation_pct,
    toDecimal128(intDiv(act_s * 10000 + 1800, 3600), 4) / 10000 AS active_gpu_h,
    toDecimal128(intDiv(starv_s * 10000 + 1800, 3600), 4) / 10000 AS starved_gpu_h,
    toDecimal128(intDiv(idl_s * 10000 + 1800, 3600), 4) / 10000 AS idle_gpu_h,
    toDecimal128(intDiv(drk_s * 10000 + 1800, 3600), 4) / 10000 AS dark_gpu_h,
    toDecimal128(intDiv(idle_num + 18000000, 36000000), 2) / 100 AS idle_cost,
    if(alloc_s = 0, 0, round(100 * (alloc_s - drk_s) / alloc_s, 1)) AS coverage_pct,
    toDecimal128(intDiv(unpriced * 10000 + 1800, 3600), 4) / 10000 AS unpriced_gpu_h,
    toDecimal128(intDiv(onprem_s * 10000 + 1800, 3600), 4) / 10000 AS onprem_gpu_h,
    toDecimal128(intDiv((alloc_s - onprem_s) * 10000 + 1800, 3600), 4) / 10000 AS cloud_gpu_h,
    multiIf(alloc_s = onprem_s, toDecimal128(0, 2),
            onprem_s = 0, toDecimal128(floor_cents + if(cent_rank <= leftover_cents, 1, 0), 2) / 100,
            toDecimal128(intDiv(num - onprem_num + 18000000, 36000000), 2) / 100) AS cloud_charge,
    toDecimal128(floor_cents + if(cent_rank <= leftover_cents, 1, 0), 2) / 100 - cloud_charge AS onprem_charge,
    alloc_s AS allocated_seconds,
    act_s AS active_seconds,
    starv_s AS starved_seconds,
    idl_s AS idle_seconds,
    drk_s AS dark_seconds,
    num AS charge_numerator,
    idle_num AS idle_charge_numerator
FROM
(
    SELECT *,
           intDiv(num, 36000000) AS floor_cents,
           row_number() OVER (ORDER BY num % 36000000 DESC, team, cluster) AS cent_rank,
           intDiv(sum(num) OVER () + 18000000, 36000000) - sum(intDiv(num, 36000000)) OVER () AS leftover_cents
    FROM
    (
        SELECT {period:String} AS period, team, cluster,
               uniqExact(cluster, job_id, job_start_ms) AS jobs,
               toInt128(sum(allocated_s)) AS alloc_s,
               toInt128(sum(active_s)) AS act_s,
               toInt128(sum(starved_s)) AS starv_s,
               toInt128(sum(idle_s)) AS idl_s,
               toInt128(sum(dark_s)) AS drk_s,
               toInt128(sum(unpriced_s)) AS unpriced,
               toInt128(sumIf(allocated_s, pricing_tier = 'on-prem')) AS onprem_s,
               sumIf(charge_num, pricing_tier = 'on-prem') AS onprem_num,
               sum(charge_num) AS num,
               sum(idle_charge_num) AS idle_num
        FROM v_usage_priced
        WHERE day >= toDate(concat({period:String}, '-01'))
          AND day < addMonths(toDate(concat({period:String}, '-01')), 1)
        GROUP BY team, cluster
    )
);
