-- The devices two clusters claimed on one day: where 016's contested minutes can be.
CREATE OR REPLACE VIEW v_device_days_contested AS
SELECT day, device_uuid, mig_instance_id, groupUniqArrayArray(holders) AS all_holders,
       groupUniqArrayArray(jobs) AS all_jobs
FROM device_cluster_days
WHERE (device_uuid, mig_instance_id) IN (SELECT device_uuid, mig_instance_id FROM v_devices_multi_cluster)
GROUP BY day, device_uuid, mig_instance_id
HAVING length(arrayDistinct(arrayMap(h -> h.1, all_holders))) > 1;
