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
-- include: chargeback_line_columns
           row_number() OVER (PARTITION BY period, by ORDER BY num % 36000000 DESC, line) AS cent_rank,
           intDiv(sum(num) OVER (PARTITION BY period, by) + 18000000, 36000000)
               - sum(intDiv(num, 36000000)) OVER (PARTITION BY period, by) AS leftover_cents
    FROM
    (
        SELECT period, by, line,
               uniqExact(cluster, job_id, job_start_ms) AS jobs,
-- include: chargeback_line_sums
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
