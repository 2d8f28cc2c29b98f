CREATE OR REPLACE VIEW v_job_claims AS
SELECT cluster, job_id, any(user) AS user, any(project) AS charged_project,
       any(project_claimed) AS claimed_project, min(ts_ms) AS first_ts_ms
FROM job_events FINAL
WHERE project_claimed IS NOT NULL
GROUP BY cluster, job_id;
