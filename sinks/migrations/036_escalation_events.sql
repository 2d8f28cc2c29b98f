-- Escalations (issue 41 item 5): every step of a request to raise a job's priority (escalations.v1), as the sink
-- stores them, one row per step. What the steps mean (the first valid decision counts, when the raise ends) is the
-- pure fold of schemas/governance_escalations.py under the policy, the same code the commands and the service run;
-- the statements read this table for the priced raises (sinks/governance.py).

CREATE TABLE IF NOT EXISTS escalation_events
(
    event_id String,
    event_type LowCardinality(String) COMMENT 'REQUESTED, GRANTED, DENIED, LAPSED, APPLIED, REVERTED',
    escalation_id String,
    ts_ms Int64,
    actor String COMMENT 'who took the step',
    cluster String,
    job_id String,
    user Nullable(String),
    team Nullable(String),
    gpus Int32,
    tier String COMMENT 'the policy tier the job runs at while raised',
    hours Int32,
    text String COMMENT 'reason, decision note, or what the scheduler did',
    until_ms Nullable(Int64),
    deadline_ms Nullable(Int64),
    engine Nullable(String),
    engine_ref Nullable(String) COMMENT 'what the job had before it was raised (QOS, priority class)'
)
ENGINE = ReplacingMergeTree
ORDER BY (escalation_id, event_id);
