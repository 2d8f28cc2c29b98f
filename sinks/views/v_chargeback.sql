-- The chargeback report: one line per (period, grouping, value). `by` is team, project, user or
-- cost-centre. GPU-hours are rounded half-up to 4 places, money half-up to the cent, per line.
-- Charges per line that add up. Rounding every line half-up lets the lines of one grouping sum to
-- a few cents more or less than another grouping's (and than the finance journal). Instead, for
-- each (period, grouping): the total is the exact grand total rounded half-up to the cent, each
-- line gets its exact charge rounded down, and the cents left over go one each to the lines with
-- the largest remainders (ties by line name). Every line is within a cent of its exact value and
-- every grouping, the journal included, totals the same. Idle cost stays half-up per line (it is
-- informational, never billed).
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
