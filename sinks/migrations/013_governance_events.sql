-- Governance workflows (issue 19): every step of an appeal (appeals.v1) and of a reservation
-- (reservations.v1), as the sink stores them, one row per step. What the steps mean (the first valid
-- decision counts, a reservation's window, ...) is not decided here but by the same pure fold the commands use
-- (schemas/governance_appeals.py, schemas/governance_reservations.py); `period close` reads these tables to
-- put granted credits and reservation charges on the statements.

CREATE TABLE IF NOT EXISTS appeal_events
(
    event_id String,
    event_type LowCardinality(String) COMMENT 'FILED, DECIDED, ESCALATED',
    appeal_id String,
    ts_ms Int64,
    actor String COMMENT 'who took the step',
    cluster String,
    job_id String,
    alert_id Nullable(String),
    user Nullable(String),
    team Nullable(String),
    project Nullable(String),
    period Nullable(String) COMMENT 'the month of the charge appealed about',
    text String COMMENT 'reason, decision note, or why escalated',
    decision Nullable(String) COMMENT 'EXEMPTION, CREDIT, DENIED',
    credit_cents Nullable(Int64),
    exemption_until_ms Nullable(Int64),
    deadline_ms Nullable(Int64)
)
ENGINE = ReplacingMergeTree
ORDER BY (appeal_id, event_id);

CREATE TABLE IF NOT EXISTS reservation_events
(
    event_id String,
    event_type LowCardinality(String) COMMENT 'REQUESTED, APPROVED, EXTENDED, RENDERED, REMOVED, IDLE_WARNED, RELEASED, EXPIRED',
    reservation_id String,
    ts_ms Int64,
    actor String,
    cluster String,
    team String,
    generation LowCardinality(String),
    gpus Int32,
    nodes Array(String),
    start_ms Int64,
    end_ms Int64,
    text String,
    engine Nullable(String),
    engine_ref Nullable(String)
)
ENGINE = ReplacingMergeTree
ORDER BY (reservation_id, event_id);
