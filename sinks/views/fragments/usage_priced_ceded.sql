-- The seconds one cluster cedes to another on a device-minute both claimed, as negative rows, each given the
-- life holding that minute (read only when some device-day is contested). v_usage_priced's second branch;
-- its single twin, v_usage_priced_single, is without it.
    UNION ALL
    SELECT x.day, x.cluster, x.job_id, x.user, x.team, x.project, x.cost_centre, x.generation, x.pricing_tier,
           x.preemptible, -x.ceded_s, -x.ceded_active_s, -x.ceded_starved_s, -x.ceded_idle_s, -x.ceded_dark_s,
           toFloat64(0), toInt64(0), x.gpu_share_slices, x.gpu_share_of, l.job_start_ms
    FROM
    (
        SELECT *, minute_start_ms + 60000 AS end_ms FROM v_device_claims_resolved WHERE ceded_s > 0
    ) AS x
    ASOF LEFT JOIN
    (
        SELECT cluster, job_id, job_start_ms FROM v_job_lives WHERE (SELECT count() FROM v_device_days_contested) > 0
    ) AS l ON x.cluster = l.cluster AND x.job_id = l.job_id AND x.end_ms > l.job_start_ms
