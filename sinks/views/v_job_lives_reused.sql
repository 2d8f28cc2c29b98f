-- The lives of the reused ids: job_lives grouped by submit time, numbered in start order (`later`: not the
-- id's first life; an id of one life is never `later`). v_job_lives is the same over every id:
-- variant: v_job_lives without job_ids_reused_only
CREATE OR REPLACE VIEW v_job_lives_reused AS
SELECT cluster, job_id, submit_ms, job_start_ms, job_last_ms,
       row_number() OVER (PARTITION BY cluster, job_id ORDER BY job_start_ms, submit_ms) > 1 AS later
FROM
(
    SELECT cluster, job_id, submit_ms, min(job_start_ms) AS job_start_ms, max(job_last_ms) AS job_last_ms
    FROM job_lives
-- include: job_ids_reused_only
    GROUP BY cluster, job_id, submit_ms
    HAVING sum(starts) > 0
);
