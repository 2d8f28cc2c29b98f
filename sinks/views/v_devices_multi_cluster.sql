-- The devices two clusters ever claimed (duplicates before a merge count once: uniqExact).
CREATE OR REPLACE VIEW v_devices_multi_cluster AS
SELECT device_uuid, mig_instance_id
FROM device_clusters
GROUP BY device_uuid, mig_instance_id
HAVING uniqExact(cluster) > 1;
