CREATE OR REPLACE VIEW v_device_overlaps AS
SELECT
    formatDateTime(day, '%Y-%m') AS period,
    device_uuid,
    mig_instance_id,
    holder_cluster,
    holder_job_id,
    cluster AS ceded_cluster,
    job_id AS ceded_job_id,
    min(minute_start_ms) AS first_minute_ms,
    max(minute_start_ms) AS last_minute_ms,
    toInt64(sum(ceded_s)) AS overlap_s
FROM v_device_claims_resolved
WHERE ceded_s > 0
GROUP BY period, device_uuid, mig_instance_id, holder_cluster, holder_job_id, ceded_cluster, ceded_job_id;
