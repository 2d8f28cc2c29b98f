-- A chargeback line's sums over a closed month {period:String}: its frozen usage lines (v_statement_lines),
-- jobs counted by (cluster, job id), idle recomputed from the frozen seconds and rate. After a
-- chargeback_month_by_* head; the view closes with its GROUP BY.
               uniqExact(cluster, job_id) AS jobs,
-- include: chargeback_line_sums
               sum(toInt128(idle_s) * rate_micro_per_gpu_hour) AS idle_num
        FROM v_statement_lines
        WHERE period = {period:String} AND kind = 'usage'
