-- superseded-checksum: d0fa4e3633be6f67 (this file before its views moved to sinks/views/, one file per view,
-- applied after the migrations on every `gpuledger db migrate`)

-- 020's guard without grouping the whole history of device_cluster_days (issue 20, item 6). Every read of
-- v_usage_priced asked v_device_days_contested whether any device-day had two clusters' claims, and that view
-- grouped every row of device_cluster_days (one per device and day: 310 k rows for a month of 10,000 GPUs,
-- ~110 ms a read on two cores, growing with each month kept). A device can have a contested day only if jobs
-- of two clusters ever claimed it, so `device_clusters` keeps, per identified device, the clusters whose jobs
-- claimed it (a row per device and cluster, whatever the history's length: fed on insert from device_minutes
-- with device_cluster_days' filter), and the view now groups only the days of such devices. Columns and rows
-- are 017's: the prefilter removes only devices that no two clusters ever claimed.

CREATE TABLE IF NOT EXISTS device_clusters
(
    device_uuid String,
    mig_instance_id Int32,
    cluster String
)
ENGINE = ReplacingMergeTree
ORDER BY (device_uuid, mig_instance_id, cluster);

-- The claims already stored, once, from 017's table (which holds the same devices and clusters).
INSERT INTO device_clusters
SELECT DISTINCT device_uuid, mig_instance_id, h.1
FROM device_cluster_days
ARRAY JOIN holders AS h;

CREATE MATERIALIZED VIEW IF NOT EXISTS device_clusters_mv TO device_clusters AS
SELECT DISTINCT device_uuid, mig_instance_id, cluster
FROM device_minutes
WHERE job_id != '' AND allocated_s > 0 AND NOT startsWith(device_uuid, 'unidentified:');
