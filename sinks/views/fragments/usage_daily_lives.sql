-- usage_daily's rows for finding each one's job life: seconds as Int64, and the end of the row's day (end_ms,
-- epoch ms), the life being the last one started before it. v_usage_lives_single and v_usage_lives' ASOF
-- branch read it, each with its own WHERE (ids never reused, ids reused).
    SELECT day, cluster, job_id, user, team, project, cost_centre, generation, pricing_tier, preemptible,
           toInt64(allocated_s) AS allocated_s, toInt64(active_s) AS active_s, toInt64(starved_s) AS starved_s,
           toInt64(idle_s) AS idle_s, toInt64(dark_s) AS dark_s, sm_weighted_s,
           toInt64(device_minutes) AS device_minutes, gpu_share_slices, gpu_share_of,
           (toInt64(toUnixTimestamp(toDateTime(day, 'UTC'))) + 86400) * 1000 AS end_ms
    FROM usage_daily
