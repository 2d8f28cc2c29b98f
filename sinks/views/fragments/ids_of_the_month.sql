-- The ids with usage in the month {period:String} (usage_daily's key starts with the day: a range of its parts). By
-- job_id alone: a set of one column costs a fraction of a (cluster, job_id) set's, and an id of the month on another
-- cluster only keeps that cluster's lives here; the join still matches on both columns.
  AND job_id IN (SELECT job_id FROM usage_daily WHERE job_id != ''
                 AND day >= toDate(concat({period:String}, '-01'))
                 AND day < addMonths(toDate(concat({period:String}, '-01')), 1))
