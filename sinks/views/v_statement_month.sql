-- A closed month's report: v_chargeback_month's columns and cent allocation over the frozen usage lines, so
-- `report chargeback --period` of a closed month shows what was closed, whatever changed since.
--   SELECT * FROM v_statement_month(period = '2026-11', by = 'team')
CREATE OR REPLACE VIEW v_statement_month AS
-- include: chargeback_month_by_line
-- include: chargeback_sums_closed_month
        GROUP BY line
    )
);
