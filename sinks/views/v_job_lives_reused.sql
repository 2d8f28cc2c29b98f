-- v_job_lives' rows of the reused ids (an id of one life is never `later`).
CREATE OR REPLACE VIEW v_job_lives_reused AS
SELECT cluster, job_id, submit_ms, job_start_ms, job_last_ms,
       row_number() OVER (PARTITION BY cluster, job_id ORDER BY job_start_ms, submit_ms) > 1 AS later
FROM
(
    SELECT cluster, job_id, submit_ms, min(job_start_ms) AS job_start_ms, max(job_last_ms) AS job_last_ms
    FROM job_lives
    WHERE (cluster, job_id) IN (SELECT cluster, job_id FROM job_ids_reused)
    GROUP BY cluster, job_id, submit_ms
    HAVING sum(starts) > 0
);
