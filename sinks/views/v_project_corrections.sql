CREATE OR REPLACE VIEW v_project_corrections AS
SELECT cluster, job_id, latest.1 AS project, latest.2 AS correction_id, latest.3 AS reason, corrections
FROM
(
    SELECT cluster, job_id,
           argMax(tuple(new_project, correction_id, reason), tuple(ts_ms, correction_id)) AS latest,
           count() AS corrections
    FROM attribution_corrections FINAL
    GROUP BY cluster, job_id
);
