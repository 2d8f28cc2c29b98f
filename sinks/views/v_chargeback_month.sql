-- One month and one grouping, filtered before anything is joined or grouped: the view the CLI
-- report reads. Same columns and the same cent allocation as v_chargeback (which spans every
-- period and grouping, for browsing); the tests check the two agree.
--   SELECT * FROM v_chargeback_month(period = '2026-11', by = 'team')
-- Its single twin, read for a month of one life per job id and nothing contested (notes: v_month_single_lives.sql),
-- and that twin over the month's lives only, read once the ledger holds many months (v_job_lives_month.sql):
-- variant: v_chargeback_month_single replaces v_usage_priced with v_usage_priced_single
-- variant: v_chargeback_month_lives replaces v_usage_priced with v_usage_priced_month_lives(period)
-- tests/integration/test_priced_views_single.py compares their lines.
CREATE OR REPLACE VIEW v_chargeback_month AS
-- include: chargeback_month_by_line
-- include: chargeback_sums_open_month
        GROUP BY line
    )
);
