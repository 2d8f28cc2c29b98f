-- A name and its identifier (issue 38, items 1 and 2; sched.job-events v4). Identity in the ledger is the user
-- name plus its identifier (`user_uid`: the POSIX uid on Slurm, the stamped requester's uid on Kubernetes; null
-- when the source gave none), so an account recreated under the same name is a second identity. `user_source`
-- says where the name came from (SCHEDULER, STAMPED, SELF_DECLARED, NAMESPACE; null in events written before
-- v4); `user_claimed` keeps a self-declared user that disagreed with the verified submitter (never charged);
-- `user_groups` the verified submitter's groups. Added like 011's project_claimed: the charge views are unchanged
-- (a job's charge never depended on its uid); the identity is read beside them.
ALTER TABLE job_events ADD COLUMN IF NOT EXISTS user_uid Nullable(String) AFTER user;
ALTER TABLE job_events ADD COLUMN IF NOT EXISTS user_source LowCardinality(Nullable(String)) AFTER user_uid;
ALTER TABLE job_events ADD COLUMN IF NOT EXISTS user_claimed Nullable(String) AFTER user_source;
ALTER TABLE job_events ADD COLUMN IF NOT EXISTS user_groups Array(String) AFTER user_claimed;

-- One row per life of a job (022's lives: one submit time of an id, with a STARTED event), keyed as
-- v_chargeback_jobs' rows are: (cluster, job_id, job_start_ms). The latest non-null of each identity column (a
-- later event that lacks one keeps the earlier's); `report explain`, the job page and the data-quality figure
-- read it beside the charges.
CREATE VIEW IF NOT EXISTS v_job_identities AS
SELECT cluster, job_id, ifNull(submit_ts_ms, toInt64(0)) AS submit_ms,
       minIf(ifNull(start_ts_ms, ts_ms), event_type = 'STARTED') AS job_start_ms,
       argMax(user, (ts_ms, event_id)) AS user,
       argMax(user_uid, (ts_ms, event_id)) AS user_uid,
       argMax(user_source, (ts_ms, event_id)) AS user_source,
       argMax(user_claimed, (ts_ms, event_id)) AS user_claimed,
       argMax(user_groups, (ts_ms, event_id)) AS user_groups
FROM job_events
GROUP BY cluster, job_id, submit_ms
HAVING countIf(event_type = 'STARTED') > 0;

-- The directory of identities the ledger has seen: one row per (name, identifier), never one per name. A name
-- with two identifiers is two rows; `user_uid` null is the name's jobs whose source gave no identifier.
CREATE VIEW IF NOT EXISTS v_identities AS
SELECT user, user_uid, argMax(user_source, job_start_ms) AS user_source, groupUniqArray(cluster) AS clusters,
       count() AS jobs, min(job_start_ms) AS first_start_ms, max(job_start_ms) AS last_start_ms,
       countIf(user_claimed IS NOT NULL) AS claimed_jobs
FROM v_job_identities
GROUP BY user, user_uid;

-- The data-quality tally a close freezes gains the identity findings (sinks/data_quality.py Tally): jobs whose
-- self-declared user disagreed with the verified one, and allocated seconds whose user is only self-declared
-- (SELF_DECLARED or NAMESPACE). A statement closed before has 0 in both and keeps its hash (sinks/statements.py
-- leaves zero identity counts out of the hashed text).
ALTER TABLE statement_data_quality ADD COLUMN IF NOT EXISTS claimed_user_jobs UInt64 DEFAULT 0
    COMMENT 'jobs whose self-declared user disagreed with the verified submitter';
ALTER TABLE statement_data_quality ADD COLUMN IF NOT EXISTS self_declared_s Int64 DEFAULT 0
    COMMENT 'allocated seconds of jobs whose user is only self-declared (SELF_DECLARED or NAMESPACE)';

-- 024's view, in full: its `*` now reads the two columns above.
CREATE OR REPLACE VIEW v_statement_data_quality AS
SELECT * FROM statement_data_quality FINAL
WHERE statement_id IN (SELECT statement_id FROM v_statements);
