-- Only the ids with more than one life (job_ids_reused): what v_job_lives_reused reads of job_lives, and
-- v_job_lives (its variant) does not.
    WHERE (cluster, job_id) IN (SELECT cluster, job_id FROM job_ids_reused)
