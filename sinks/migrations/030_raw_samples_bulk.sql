-- Raw samples in bulk (issue 21, item 4): the sink hands a batch of node scrapes to ClickHouse as one Avro container
-- (`sinks/bulk_samples.py`) instead of decoding, checking and mapping each in Python, so ClickHouse's own Avro reader
-- decodes them. Each scrape is one block of the container, a record (head, scrape, tail): head and tail are one
-- random number per insert, so a scrape's body that is not exactly one datum (bytes missing: the block ends early,
-- an error; bytes left over: the tail read is not the head) fails the insert. So does a value the contract refuses:
-- the checks below are `schemas.models`' rules for a telemetry.device-samples record (identifiers not empty, *_ratio
-- in [0, 1], *_pct in [0, 100], counts and measures >= 0, text valid UTF-8), and a test derives its cases from the
-- model. A failed insert stores nothing the sink relies on: it sends the same batch record by record, which
-- dead-letters exactly the bad records with their reason (raw_samples is a ReplacingMergeTree, so rows stored by a
-- partly run insert are replaced by the same rows).
-- The tuple is the schema's latest version (the sink takes only records whose header names it, and checks that the
-- fingerprint is the one this table was built for); a new version of the schema needs a new migration.
CREATE TABLE IF NOT EXISTS raw_scrapes_bulk
(
    head Int64,
    scrape Tuple(
        cluster String,
        node String,
        ts_ms Int64,
        source String,
        exporter_version Nullable(String),
        mapping_version String,
        devices Array(Tuple(
            uuid String,
            index Nullable(Int32),
            mig_instance_id Nullable(Int32),
            mig_profile Nullable(String),
            model Nullable(String),
            pci_bus_id Nullable(String),
            sm_active_ratio Nullable(Float64),
            sm_occupancy_ratio Nullable(Float64),
            gr_engine_active_ratio Nullable(Float64),
            tensor_active_ratio Nullable(Float64),
            dram_active_ratio Nullable(Float64),
            gpu_util_pct Nullable(Float64),
            mem_copy_util_pct Nullable(Float64),
            fb_used_mib Nullable(Float64),
            fb_free_mib Nullable(Float64),
            power_w Nullable(Float64),
            pcie_tx_bytes_per_s Nullable(Float64),
            pcie_rx_bytes_per_s Nullable(Float64),
            temperature_c Nullable(Float64),
            xid_last Nullable(Int32),
            pod Nullable(String),
            namespace Nullable(String),
            container Nullable(String),
            hpc_job Nullable(String)
        ))
    ),
    tail Int64
)
ENGINE = Null;

CREATE MATERIALIZED VIEW IF NOT EXISTS raw_scrapes_bulk_mv TO raw_samples AS
SELECT
    scrape.cluster AS cluster,
    scrape.node AS node,
    scrape.ts_ms AS ts_ms,
    scrape.source AS source,
    ifNull(scrape.exporter_version, '') AS exporter_version,
    scrape.mapping_version AS mapping_version,
    d.uuid AS device_uuid,
    d.index AS device_index,
    ifNull(d.mig_instance_id, -1) AS mig_instance_id,
    ifNull(d.mig_profile, '') AS mig_profile,
    ifNull(d.model, '') AS model,
    d.sm_active_ratio AS sm_active_ratio,
    d.sm_occupancy_ratio AS sm_occupancy_ratio,
    d.gr_engine_active_ratio AS gr_engine_active_ratio,
    d.tensor_active_ratio AS tensor_active_ratio,
    d.dram_active_ratio AS dram_active_ratio,
    d.gpu_util_pct AS gpu_util_pct,
    d.mem_copy_util_pct AS mem_copy_util_pct,
    d.fb_used_mib AS fb_used_mib,
    d.fb_free_mib AS fb_free_mib,
    d.power_w AS power_w,
    d.temperature_c AS temperature_c,
    d.xid_last AS xid_last,
    ifNull(d.pod, '') AS pod,
    ifNull(d.namespace, '') AS namespace,
    ifNull(d.container, '') AS container,
    ifNull(d.hpc_job, '') AS hpc_job
FROM raw_scrapes_bulk
LEFT ARRAY JOIN scrape.devices AS d
-- LEFT: a scrape without devices stores no row, yet its own fields are checked. The throwIf comes first, so it sees
-- every row; the row of a scrape without devices is dropped by a condition on the joined device (one on the scrape
-- alone would be moved before the join, and that scrape's fields never checked).
WHERE throwIf(
    head != tail
    OR scrape.cluster = '' OR scrape.node = '' OR scrape.ts_ms < 0
    OR NOT isValidUTF8(scrape.cluster) OR NOT isValidUTF8(scrape.node) OR NOT isValidUTF8(scrape.source)
    OR NOT isValidUTF8(ifNull(scrape.exporter_version, '')) OR NOT isValidUTF8(scrape.mapping_version)
    OR notEmpty(scrape.devices) AND (
        d.uuid = '' OR ifNull(d.pci_bus_id = '', 0)
        OR NOT isValidUTF8(d.uuid) OR NOT isValidUTF8(ifNull(d.mig_profile, '')) OR NOT isValidUTF8(ifNull(d.model, ''))
        OR NOT isValidUTF8(ifNull(d.pci_bus_id, '')) OR NOT isValidUTF8(ifNull(d.pod, ''))
        OR NOT isValidUTF8(ifNull(d.namespace, '')) OR NOT isValidUTF8(ifNull(d.container, ''))
        OR NOT isValidUTF8(ifNull(d.hpc_job, ''))
        OR NOT ifNull(d.index >= 0, 1)
        OR NOT ifNull(d.sm_active_ratio BETWEEN 0 AND 1, 1)
        OR NOT ifNull(d.sm_occupancy_ratio BETWEEN 0 AND 1, 1)
        OR NOT ifNull(d.gr_engine_active_ratio BETWEEN 0 AND 1, 1)
        OR NOT ifNull(d.tensor_active_ratio BETWEEN 0 AND 1, 1)
        OR NOT ifNull(d.dram_active_ratio BETWEEN 0 AND 1, 1)
        OR NOT ifNull(d.gpu_util_pct BETWEEN 0 AND 100, 1)
        OR NOT ifNull(d.mem_copy_util_pct BETWEEN 0 AND 100, 1)
        OR NOT ifNull(d.fb_used_mib >= 0, 1)
        OR NOT ifNull(d.fb_free_mib >= 0, 1)
        OR NOT ifNull(d.power_w >= 0, 1)
        OR NOT ifNull(d.pcie_tx_bytes_per_s >= 0, 1)
        OR NOT ifNull(d.pcie_rx_bytes_per_s >= 0, 1)),
    'raw_scrapes_bulk: a record is not one datum or breaks the contract, the sink sends the batch record by record'
) = 0
-- drops the row of a scrape without devices (a device's uuid is never empty past the check)
AND d.uuid != '';
