-- The month's priced usage without the lives and claims machinery, for a month that needs none (issue 20, item 6).
-- Every read of v_usage_priced (and of v_chargeback_month above it) spent ~75 ms of ~110-170 planning it, at 10,000
-- GPUs on two cores, whatever it read: the server analyses every branch of the views below it before reading a row,
-- and two of them are rarely non-empty. Without them a read was planned in ~20 ms (docs/benchmarks.md):
-- * usage rows of ids with two lives (v_usage_lives' ASOF branch and its shared-days branch);
-- * the seconds one cluster cedes to another on a device-minute both claimed (v_usage_priced's negative rows).
-- `v_month_single_lives(period)` says whether a month has either: usage_daily rows of the month whose id is in
-- job_ids_reused (the shared-days branch reads only such ids' days), and contested device-days in the month (the
-- only days with ceded seconds). When it has neither, v_usage_priced's rows of the month are exactly
-- `v_usage_priced_single`'s, and v_chargeback_month's lines `v_chargeback_month_single`'s: the web pages read those
-- then (gpuledger/web/queries.py `priced_views`), and the full views otherwise. The single views are 023's and 022's
-- text over `v_usage_lives_single`, v_usage_lives' first branch, which v_usage_lives now reads (its rows unchanged).
-- A page checks and then reads: an id marked reused, or a day contested, between the two is read as at the check
-- (its rows, or its ceded seconds, appear from the next read). A later change to v_usage_priced or
-- v_chargeback_month is made to its single twin too: tests/integration/test_priced_views_single.py compares their
-- rows and lines on a month of one life per id.

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
    SELECT day, cluster, job_id, user, team, project, cost_centre, generation, pricing_tier, preemptible,
           toInt64(allocated_s) AS allocated_s, toInt64(active_s) AS active_s, toInt64(starved_s) AS starved_s,
           toInt64(idle_s) AS idle_s, toInt64(dark_s) AS dark_s, sm_weighted_s,
           toInt64(device_minutes) AS device_minutes, gpu_share_slices, gpu_share_of,
           (toInt64(toUnixTimestamp(toDateTime(day, 'UTC'))) + 86400) * 1000 AS end_ms
    FROM usage_daily
    WHERE job_id != '' AND (cluster, job_id) NOT IN (SELECT cluster, job_id FROM job_ids_reused)
) AS u
ANY LEFT JOIN (SELECT cluster, job_id, job_start_ms FROM job_lives FINAL WHERE starts > 0) AS l
    ON u.cluster = l.cluster AND u.job_id = l.job_id;

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

CREATE OR REPLACE VIEW v_chargeback_month_single AS
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
        FROM v_usage_priced_single
        WHERE day >= toDate(concat({period:String}, '-01'))
          AND day < addMonths(toDate(concat({period:String}, '-01')), 1)
        GROUP BY line
    )
);

CREATE OR REPLACE VIEW v_month_single_lives AS
SELECT {period:String} AS period, reused_rows, contested_days, reused_rows = 0 AND contested_days = 0 AS single
FROM
(
    SELECT
        (
            SELECT count() FROM usage_daily
            WHERE day >= toDate(concat({period:String}, '-01'))
              AND day < addMonths(toDate(concat({period:String}, '-01')), 1)
              AND job_id != '' AND (cluster, job_id) IN (SELECT cluster, job_id FROM job_ids_reused)
        ) AS reused_rows,
        (
            SELECT count() FROM v_device_days_contested
            WHERE day >= toDate(concat({period:String}, '-01'))
              AND day < addMonths(toDate(concat({period:String}, '-01')), 1)
        ) AS contested_days
);
