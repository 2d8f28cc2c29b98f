-- superseded-checksum: 721ca6cdc139e5ec (this file before its views moved to sinks/views/, one file per view,
-- applied after the migrations on every `gpuledger db migrate`)

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

-- The data-quality tally a close freezes gains the identity findings (sinks/data_quality.py Tally): jobs whose
-- self-declared user disagreed with the verified one, and allocated seconds whose user is only self-declared
-- (SELF_DECLARED or NAMESPACE). A statement closed before has 0 in both and keeps its hash (sinks/statements.py
-- leaves zero identity counts out of the hashed text).
ALTER TABLE statement_data_quality ADD COLUMN IF NOT EXISTS claimed_user_jobs UInt64 DEFAULT 0
    COMMENT 'jobs whose self-declared user disagreed with the verified submitter';
ALTER TABLE statement_data_quality ADD COLUMN IF NOT EXISTS self_declared_s Int64 DEFAULT 0
    COMMENT 'allocated seconds of jobs whose user is only self-declared (SELF_DECLARED or NAMESPACE)';
