-- Minute rows start on a UTC minute boundary (half-open [m, m + 60 s) windows). A row that does
-- not is refused by ClickHouse and the sink sends it to the dead-letter topic with the reason.
ALTER TABLE device_minutes ADD CONSTRAINT IF NOT EXISTS minute_aligned CHECK minute_start_ms % 60000 = 0;
ALTER TABLE job_minutes ADD CONSTRAINT IF NOT EXISTS job_minute_aligned CHECK minute_start_ms % 60000 = 0;
ALTER TABLE coverage_minutes ADD CONSTRAINT IF NOT EXISTS coverage_minute_aligned CHECK minute_start_ms % 60000 = 0;
