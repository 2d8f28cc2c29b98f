CREATE OR REPLACE VIEW v_jobs_current AS
SELECT
    cluster,
    job_id,
    argMax(event_type, (ts_ms, event_id)) AS state,
    max(ts_ms) AS last_event_ms,
    argMax(user, (ts_ms, event_id)) AS user,
    argMax(project, (ts_ms, event_id)) AS project,
    argMax(team, (ts_ms, event_id)) AS team,
    argMax(cost_centre, (ts_ms, event_id)) AS cost_centre,
    argMax(job_name, (ts_ms, event_id)) AS job_name,
    argMax(pricing_tier, (ts_ms, event_id)) AS pricing_tier,
    argMax(preemptible, (ts_ms, event_id)) AS preemptible,
    argMax(gang_size, (ts_ms, event_id)) AS gang_size,
    argMax(allocations, (ts_ms, event_id)) AS allocations,
    min(start_ts_ms) AS start_ts_ms,
    max(end_ts_ms) AS end_ts_ms
FROM job_events FINAL
GROUP BY cluster, job_id;
