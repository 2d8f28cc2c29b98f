-- 023's rows: a later life is a reused id's.
CREATE OR REPLACE VIEW v_job_days_shared AS
SELECT DISTINCT cluster, job_id, toDate(fromUnixTimestamp64Milli(job_start_ms, 'UTC')) AS day
FROM v_job_lives_reused
WHERE later;
