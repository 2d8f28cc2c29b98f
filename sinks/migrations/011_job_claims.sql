-- Attribution cannot be claimed (sched.job-events v3). A job's explicit project that its user is not
-- a member of is kept in `project_claimed` for audit; the job is charged to `project` (the user's
-- default, or none). `v_job_claims` lists those jobs, one row each; `gpuledger report explain`
-- flags them in its `claimed_project` column.
ALTER TABLE job_events ADD COLUMN IF NOT EXISTS project_claimed Nullable(String) AFTER project_validation;

CREATE VIEW IF NOT EXISTS v_job_claims AS
SELECT cluster, job_id, any(user) AS user, any(project) AS charged_project,
       any(project_claimed) AS claimed_project, min(ts_ms) AS first_ts_ms
FROM job_events FINAL
WHERE project_claimed IS NOT NULL
GROUP BY cluster, job_id;
