CREATE OR REPLACE VIEW v_coverage_daily AS
SELECT day, cluster,
       sum(expected_device_s) AS expected_s,
       sum(reporting_device_s) AS reporting_s,
       if(expected_s = 0, 100, round(100 * reporting_s / expected_s, 2)) AS coverage_pct,
       sum(unexpected_device_minutes) AS unexpected_device_minutes
FROM coverage_daily
GROUP BY day, cluster;
