-- Every `gpuledger policy apply` (issue 41 item 1), one row per apply of policy.applied.v1: who applied the policy
-- to which engine, when, and each setting it changed with its value before and after (parallel arrays, one element
-- per change). The fleet page lists the latest (web/queries.py).

CREATE TABLE IF NOT EXISTS policy_applies
(
    apply_id String,
    ts_ms Int64 COMMENT 'when the apply finished',
    cluster String,
    engine LowCardinality(String) COMMENT 'slurm or kueue',
    actor String COMMENT 'who, as the engine knows them',
    actor_source LowCardinality(String) COMMENT 'os-user or kubernetes',
    policy_sha256 String,
    change_objects Array(String),
    change_settings Array(String),
    change_before Array(Nullable(String)) COMMENT 'null: the object did not exist',
    change_after Array(Nullable(String)),
    still_differs Array(String) COMMENT 'policy diff lines left after the apply'
)
ENGINE = ReplacingMergeTree
ORDER BY apply_id;
