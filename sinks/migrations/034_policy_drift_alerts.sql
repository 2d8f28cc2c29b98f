-- Policy drift on the alerts table (issue 41 item 1, alerts v2): the policy watch (producers/policy_watch.py)
-- publishes POLICY_DRIFT / POLICY_DRIFT_CLEARED alerts naming the engine and carrying each differing line as
-- `gpuledger policy diff` prints it; the fleet page shows an engine's latest drift alert until a clear follows it.

ALTER TABLE alerts ADD COLUMN IF NOT EXISTS engine Nullable(String) COMMENT 'slurm or kueue (policy drift alerts)';
ALTER TABLE alerts ADD COLUMN IF NOT EXISTS drift_lines Array(String) COMMENT 'each difference, as policy diff prints it';
