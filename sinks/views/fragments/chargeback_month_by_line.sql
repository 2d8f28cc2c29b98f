-- A month's chargeback, one line per value of the grouping {by:String} (team, project, user, tier,
-- cost-centre), the cents shared over the month's lines: everything above the line's jobs and sums. The view
-- that includes it goes on with `jobs`, chargeback_line_sums, `idle_num`, its month's rows (FROM ... WHERE ...)
-- and closes with GROUP BY line ) ).
SELECT
    period, by, line, jobs,
-- include: chargeback_line_columns
           row_number() OVER (ORDER BY num % 36000000 DESC, line) AS cent_rank,
           intDiv(sum(num) OVER () + 18000000, 36000000) - sum(intDiv(num, 36000000)) OVER () AS leftover_cents
    FROM
    (
        SELECT {period:String} AS period, {by:String} AS by,
               multiIf({by:String} = 'team', team, {by:String} = 'project', project,
                       {by:String} = 'user', user, {by:String} = 'tier', pricing_tier, cost_centre) AS line,
