-- superseded-checksum: f76d2a2f22c4e186 (this file before its views moved to sinks/views/, one file per view,
-- applied after the migrations on every `gpuledger db migrate`)

-- Attribution cannot be claimed (sched.job-events v3). A job's explicit project that its user is not
-- a member of is kept in `project_claimed` for audit; the job is charged to `project` (the user's
-- default, or none). `v_job_claims` lists those jobs, one row each; `gpuledger report explain`
-- flags them in its `claimed_project` column.
ALTER TABLE job_events ADD COLUMN IF NOT EXISTS project_claimed Nullable(String) AFTER project_validation;
