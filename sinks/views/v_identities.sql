-- The directory of identities the ledger has seen: one row per (name, identifier), never one per name. A name
-- with two identifiers is two rows; `user_uid` null is the name's jobs whose source gave no identifier.
CREATE OR REPLACE VIEW v_identities AS
SELECT user, user_uid, argMax(user_source, job_start_ms) AS user_source, groupUniqArray(cluster) AS clusters,
       count() AS jobs, min(job_start_ms) AS first_start_ms, max(job_start_ms) AS last_start_ms,
       countIf(user_claimed IS NOT NULL) AS claimed_jobs
FROM v_job_identities
GROUP BY user, user_uid;
