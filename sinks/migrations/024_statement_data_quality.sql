-- superseded-checksum: 8dc1d0a3b6835697 (this file before its views moved to sinks/views/, one file per view,
-- applied after the migrations on every `gpuledger db migrate`)

-- The data-quality figure frozen with each closed statement (issue 19; sinks/data_quality.py). A close writes
-- one row per statement: the additive sums the figure is made of over the team's jobs of the month, as the
-- ledger had them at the close. They are in the statement's content hash (`statement verify` recomputes it),
-- and `report chargeback --period <closed month>` shows the figure of the month's sum, not the ledger's now.
-- A statement closed before this table existed has no row here: its month's reports say the figure is the
-- ledger's now. Written before the statements row, so an interrupted close leaves nothing any view shows.

CREATE TABLE IF NOT EXISTS statement_data_quality
(
    statement_id String,
    period String,
    team String,
    jobs UInt64,
    allocated_s Int64,
    dark_s Int64 COMMENT 'allocated seconds without telemetry',
    unidentified_s Int64 COMMENT 'allocated seconds on devices no source identified (device_uuid unidentified:*)',
    unidentified_jobs UInt64,
    default_project_s Int64 COMMENT 'allocated seconds of jobs charged to their user''s default project',
    claimed_project_s Int64 COMMENT 'allocated seconds of jobs that named a project their user is not a member of',
    unpriced_s Int64,
    unknown_mig_s Int64 COMMENT 'the part of unpriced_s on MIG slices of unknown profile',
    ceded_s Int64 COMMENT 'seconds claimed by two clusters at once, ceded to the later-started job',
    overlap_jobs UInt64
)
ENGINE = ReplacingMergeTree
ORDER BY statement_id;
