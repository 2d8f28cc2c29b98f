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

-- Each reclaim action with how it ended: the latest outcome row per action.
CREATE VIEW IF NOT EXISTS v_actions AS
SELECT a.action_id AS action_id, a.ts_ms AS ts_ms, a.cluster AS cluster, a.job_id AS job_id,
       a.scheduler AS scheduler, a.action AS action, a.dry_run AS requested_dry_run, a.reason AS reason,
       a.user AS user, a.project AS project,
       o.last_status AS outcome, o.last_detail AS outcome_detail, o.steps AS steps_recorded
FROM actions AS a FINAL
LEFT JOIN
(
    SELECT action_id, argMax(status, (ts_ms, step)) AS last_status, argMax(detail, (ts_ms, step)) AS last_detail,
           count() AS steps
    FROM action_outcomes FINAL
    GROUP BY action_id
) AS o ON a.action_id = o.action_id;
