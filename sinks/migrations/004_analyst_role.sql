-- requires: access-management
-- A read-only analyst role on a server with SQL access management. Where the server has none
-- (the embedded chDB server authorises its read-only analyst user itself), the runner records
-- this migration as skipped with the server's reason.
CREATE ROLE IF NOT EXISTS gpuledger_analyst;
GRANT SELECT ON {database}.* TO gpuledger_analyst;
