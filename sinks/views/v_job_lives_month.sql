-- The started lives of the job ids (job_lives merged: one row per id and submit time with a STARTED event), as the
-- single-lives views join them to usage_daily rows by (cluster, job_id). `v_job_lives_month(period)` keeps only
-- the ids with a usage_daily row in the month {period:String}: a read of one month then builds its join from that
-- month's ids (~70,000 at 10,000 GPUs) instead of every life ever stored (821,413 after a year, and growing; issue 44
-- item 6: the team page at 12 months of history). Same rows for that month's usage: a row's id is one of them.
-- Its variant, every id's lives, is what v_usage_lives_single (and so v_usage_lives) joins:
-- variant: v_job_lives_started without ids_of_the_month
CREATE OR REPLACE VIEW v_job_lives_month AS
SELECT cluster, job_id, job_start_ms
FROM job_lives FINAL
WHERE starts > 0
-- include: ids_of_the_month
;
