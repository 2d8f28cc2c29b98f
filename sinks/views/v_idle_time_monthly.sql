CREATE OR REPLACE VIEW v_idle_time_monthly AS
SELECT period, cluster, team, project,
       sum(active_s) / 3600 AS active_gpu_h,
       sum(starved_s) / 3600 AS starved_gpu_h,
       sum(idle_s) / 3600 AS idle_gpu_h,
       sum(dark_s) / 3600 AS dark_gpu_h,
       toDecimal128(intDiv(sum(idle_charge_num) + 18000000, 36000000), 2) / 100 AS idle_cost
FROM v_usage_priced
GROUP BY period, cluster, team, project;
