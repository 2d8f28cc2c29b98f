-- Notes from migration 031_single_lives_views, moved here with the view:
-- The month's priced usage without the lives and claims machinery, for a month that needs none (issue 20, item 6).
-- Every read of v_usage_priced (and of v_chargeback_month above it) spent ~75 ms of ~110-170 planning it, at 10,000
-- GPUs on two cores, whatever it read: the server analyses every branch of the views below it before reading a row,
-- and two of them are rarely non-empty. Without them a read was planned in ~20 ms (docs/benchmarks.md):
-- * usage rows of ids with two lives (v_usage_lives' ASOF branch and its shared-days branch);
-- * the seconds one cluster cedes to another on a device-minute both claimed (v_usage_priced's negative rows).
-- `v_month_single_lives(period)` says whether a month has either: usage_daily rows of the month whose id is in
-- job_ids_reused (the shared-days branch reads only such ids' days), and contested device-days in the month (the
-- only days with ceded seconds). When it has neither, v_usage_priced's rows of the month are exactly
-- `v_usage_priced_single`'s, and v_chargeback_month's lines `v_chargeback_month_single`'s: the web pages read those
-- then (web/queries.py `priced_views`), and the full views otherwise. The single views are 023's and 022's
-- text over `v_usage_lives_single`, v_usage_lives' first branch, which v_usage_lives now reads (its rows unchanged).
-- A page checks and then reads: an id marked reused, or a day contested, between the two is read as at the check
-- (its rows, or its ceded seconds, appear from the next read). A later change to v_usage_priced or
-- v_chargeback_month is made to its single twin too: tests/integration/test_priced_views_single.py compares their
-- rows and lines on a month of one life per id.
--
-- `month_lives`: a single month whose ledger holds more than four times as many lives (every month's, all clusters)
-- as the month has usage rows: its pages read the single views over the month's lives only (v_job_lives_month.sql:
-- a set of the month's ids, then a join built from their lives), which costs more than joining every life while
-- the history is short (one month of 10,000 GPUs: ~70,000 lives, as many usage rows) and far less after a year
-- (821,413 lives: the join 3-7x faster; issue 44 item 6). job_lives' count() is read from its parts' metadata.
CREATE OR REPLACE VIEW v_month_single_lives AS
SELECT {period:String} AS period, reused_rows, contested_days, reused_rows = 0 AND contested_days = 0 AS single,
       lives, month_rows, single AND lives > 4 * month_rows AS month_lives
FROM
(
    SELECT
        (SELECT count() FROM job_lives) AS lives,
        (
            SELECT count() FROM usage_daily
            WHERE day >= toDate(concat({period:String}, '-01'))
              AND day < addMonths(toDate(concat({period:String}, '-01')), 1)
              AND job_id != ''
        ) AS month_rows,
        (
            SELECT count() FROM usage_daily
            WHERE day >= toDate(concat({period:String}, '-01'))
              AND day < addMonths(toDate(concat({period:String}, '-01')), 1)
              AND job_id != '' AND (cluster, job_id) IN (SELECT cluster, job_id FROM job_ids_reused)
        ) AS reused_rows,
        (
            SELECT count() FROM v_device_days_contested
            WHERE day >= toDate(concat({period:String}, '-01'))
              AND day < addMonths(toDate(concat({period:String}, '-01')), 1)
        ) AS contested_days
);
