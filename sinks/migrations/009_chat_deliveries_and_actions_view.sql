-- superseded-checksum: 709d932b45abbaeb (this file before its views moved to sinks/views/, one file per view,
-- applied after the migrations on every `gpuledger db migrate`)

-- What the chat sink posted, so dedupe survives a restart (`gpuledger chat run` seeds its memory
-- from here) and people can see where an alert went. Destinations are masked, never the URL.
CREATE TABLE IF NOT EXISTS chat_deliveries
(
    alert_id String,
    ts_ms Int64,
    status LowCardinality(String),
    channel String,
    destination String COMMENT 'masked: scheme and a digest of the URL'
)
ENGINE = ReplacingMergeTree(ts_ms)
ORDER BY alert_id;
