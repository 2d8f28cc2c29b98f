-- Base tables. Every table a sink writes has a deterministic key (ReplacingMergeTree), so a
-- redelivered record replaces itself instead of adding a row. Times are epoch milliseconds as on
-- the wire, with a derived DateTime64 for partitioning and TTL.

CREATE TABLE IF NOT EXISTS raw_samples
(
    cluster String,
    node String,
    ts_ms Int64,
    ts DateTime64(3, 'UTC') MATERIALIZED fromUnixTimestamp64Milli(ts_ms, 'UTC'),
    source LowCardinality(String),
    exporter_version LowCardinality(String),
    mapping_version LowCardinality(String),
    device_uuid String,
    device_index Nullable(Int32),
    mig_instance_id Int32 DEFAULT -1,
    mig_profile LowCardinality(String),
    model LowCardinality(String),
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
    temperature_c Nullable(Float64),
    xid_last Nullable(Int32),
    pod String,
    namespace String,
    container String,
    hpc_job String
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMMDD(ts)
ORDER BY (cluster, node, device_uuid, mig_instance_id, ts_ms)
TTL toDateTime(ts) + toIntervalDay({raw_sample_ttl_days});

CREATE TABLE IF NOT EXISTS job_events
(
    event_id String,
    event_type LowCardinality(String),
    ts_ms Int64,
    scheduler LowCardinality(String),
    cluster String,
    job_id String,
    array_job_id Nullable(String),
    array_task_id Nullable(Int32),
    het_job_id Nullable(String),
    het_job_offset Nullable(Int32),
    job_name Nullable(String),
    user String,
    account Nullable(String),
    project Nullable(String),
    project_source LowCardinality(String),
    project_validation LowCardinality(String),
    team Nullable(String),
    cost_centre Nullable(String),
    partition Nullable(String),
    qos Nullable(String),
    preemptible Bool,
    interactive Bool,
    checkpointable Bool,
    gang_size Int32,
    gang_id Nullable(String),
    allocations String COMMENT 'JSON: [{node, devices: [{index, uuid, mig_instance_id}]}]',
    requested_devices Int32,
    pricing_tier LowCardinality(String),
    submit_ts_ms Nullable(Int64),
    start_ts_ms Nullable(Int64),
    end_ts_ms Nullable(Int64),
    exit_state Nullable(String),
    exit_code Nullable(Int32)
)
ENGINE = ReplacingMergeTree
ORDER BY (cluster, job_id, event_id);

CREATE TABLE IF NOT EXISTS identity_snapshots
(
    cluster String,
    job_id String,
    user String,
    teams Array(String),
    groups Array(String),
    cost_centre Nullable(String),
    snapshot_ts_ms Int64
)
ENGINE = ReplacingMergeTree(snapshot_ts_ms)
ORDER BY (cluster, job_id);

CREATE TABLE IF NOT EXISTS device_minutes
(
    cluster String,
    node String,
    device_uuid String,
    mig_instance_id Int32 DEFAULT -1,
    minute_start_ms Int64,
    day Date MATERIALIZED toDate(fromUnixTimestamp64Milli(minute_start_ms, 'UTC')),
    model LowCardinality(String),
    generation LowCardinality(String),
    job_id String COMMENT 'empty for unallocated telemetry',
    user String,
    project String,
    team String,
    cost_centre String,
    preemptible Bool,
    pricing_tier LowCardinality(String),
    unallocated_s UInt32,
    allocated_s UInt32,
    active_s UInt32,
    starved_s UInt32,
    idle_s UInt32,
    dark_s UInt32,
    sm_weighted_s Float64,
    sample_count UInt32,
    activity_mean_ratio Nullable(Float64),
    activity_max_ratio Nullable(Float64),
    fb_used_mib_max Nullable(Float64),
    power_w_mean Nullable(Float64),
    mapping_version LowCardinality(String),
    classifier_version LowCardinality(String),
    CONSTRAINT classes_add_up CHECK allocated_s = active_s + starved_s + idle_s + dark_s,
    CONSTRAINT within_minute CHECK allocated_s + unallocated_s <= 60
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(day)
ORDER BY (cluster, node, device_uuid, mig_instance_id, minute_start_ms);

CREATE TABLE IF NOT EXISTS job_minutes
(
    cluster String,
    job_id String,
    minute_start_ms Int64,
    day Date MATERIALIZED toDate(fromUnixTimestamp64Milli(minute_start_ms, 'UTC')),
    device_count UInt32,
    generation LowCardinality(String),
    user String,
    project String,
    team String,
    cost_centre String,
    preemptible Bool,
    pricing_tier LowCardinality(String),
    allocated_s UInt32,
    active_s UInt32,
    starved_s UInt32,
    idle_s UInt32,
    dark_s UInt32,
    sm_weighted_s Float64,
    sample_count UInt32,
    activity_mean_ratio Nullable(Float64),
    activity_max_ratio Nullable(Float64),
    fb_used_mib_max Nullable(Float64),
    power_w_mean Nullable(Float64),
    mapping_version LowCardinality(String),
    classifier_version LowCardinality(String),
    CONSTRAINT job_classes_add_up CHECK allocated_s = active_s + starved_s + idle_s + dark_s
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(day)
ORDER BY (cluster, job_id, minute_start_ms);

CREATE TABLE IF NOT EXISTS coverage_minutes
(
    cluster String,
    node String,
    minute_start_ms Int64,
    day Date MATERIALIZED toDate(fromUnixTimestamp64Milli(minute_start_ms, 'UTC')),
    expected_devices UInt32,
    reporting_devices UInt32,
    expected_device_s UInt32,
    reporting_device_s UInt32,
    unexpected_devices UInt32
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(day)
ORDER BY (cluster, node, minute_start_ms);

CREATE TABLE IF NOT EXISTS alerts
(
    alert_id String,
    kind LowCardinality(String),
    ts_ms Int64,
    cluster String,
    job_id Nullable(String),
    node Nullable(String),
    device_uuids Array(String),
    user Nullable(String),
    team Nullable(String),
    project Nullable(String),
    idle_minutes Nullable(Int32),
    cost_so_far Nullable(Float64),
    action Nullable(String),
    action_at_ms Nullable(Int64),
    dry_run Bool,
    message String,
    appeal_route Nullable(String),
    emitted_ts_ms Nullable(Int64)
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(fromUnixTimestamp64Milli(ts_ms, 'UTC'))
ORDER BY (alert_id);

CREATE TABLE IF NOT EXISTS actions
(
    action_id String,
    ts_ms Int64,
    cluster String,
    job_id String,
    scheduler LowCardinality(String),
    action LowCardinality(String),
    dry_run Bool,
    reason String,
    device_uuids Array(String),
    user Nullable(String),
    project Nullable(String)
)
ENGINE = ReplacingMergeTree
ORDER BY (action_id);

CREATE TABLE IF NOT EXISTS action_outcomes
(
    action_id String,
    step UInt16 COMMENT 'order of the command within the action',
    ts_ms Int64,
    cluster String,
    job_id String,
    scheduler LowCardinality(String),
    action LowCardinality(String),
    command String COMMENT 'what was (or, in dry-run, would have been) run',
    dry_run Bool,
    status LowCardinality(String) COMMENT 'planned (dry-run), ok, failed',
    detail String
)
ENGINE = ReplacingMergeTree(ts_ms)
ORDER BY (action_id, step);

CREATE TABLE IF NOT EXISTS attribution_corrections
(
    correction_id String,
    ts_ms Int64,
    cluster String,
    job_id String,
    old_project Nullable(String),
    new_project String,
    reason String,
    corrected_by String
)
ENGINE = ReplacingMergeTree
ORDER BY (cluster, job_id, correction_id);

CREATE TABLE IF NOT EXISTS rate_card
(
    generation LowCardinality(String),
    pricing_tier LowCardinality(String),
    preemptible Bool,
    effective_from Date,
    rate_micro_per_gpu_hour UInt64 COMMENT 'USD per GPU-hour in millionths (exact)',
    rate_per_gpu_hour Decimal(18, 6) MATERIALIZED toDecimal64(rate_micro_per_gpu_hour, 0) / 1000000,
    basis String COMMENT 'the arithmetic behind the rate, for audit',
    card_version String,
    loaded_ms Int64
)
ENGINE = ReplacingMergeTree(loaded_ms)
ORDER BY (generation, pricing_tier, preemptible, effective_from);
