CREATE OR REPLACE VIEW v_utilisation_daily AS
SELECT day, cluster, team, project, generation,
       sum(allocated_s) / 3600 AS allocated_gpu_h,
       (sum(active_s) + sum(starved_s)) / 3600 AS consumed_gpu_h,
       sum(sm_weighted_s) / 3600 AS effective_gpu_h,
       if(sum(allocated_s) = 0, 0, (sum(active_s) + sum(starved_s)) / sum(allocated_s)) AS utilisation
FROM v_usage_priced
GROUP BY day, cluster, team, project, generation;
