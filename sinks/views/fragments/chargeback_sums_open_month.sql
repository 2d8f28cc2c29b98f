-- A chargeback line's sums over a month of the open ledger: v_usage_priced's rows of the month {period:String},
-- jobs counted by life (cluster, job id, first start), idle priced at each row's rate. After a
-- chargeback_month_by_* head; the view closes with its GROUP BY.
               uniqExact(cluster, job_id, job_start_ms) AS jobs,
-- include: chargeback_line_sums
               sum(idle_charge_num) AS idle_num
        FROM v_usage_priced
        WHERE day >= toDate(concat({period:String}, '-01'))
          AND day < addMonths(toDate(concat({period:String}, '-01')), 1)
