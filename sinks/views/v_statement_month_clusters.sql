-- Notes from migration 019_statement_month_clusters, moved here with the view:
-- `report chargeback --by cluster` of a closed month (issue 18, item 5): v_statement_month's columns and cent
-- allocation over the frozen usage lines, one line per (team, cluster), as v_chargeback_month_clusters (016)
-- is for the open ledger. The frozen lines carry their cluster, and were frozen from v_usage_priced, so a
-- month closed after 016 has each device-second charged once.
--   SELECT * FROM v_statement_month_clusters(period = '2026-11')
--
CREATE OR REPLACE VIEW v_statement_month_clusters AS
-- include: chargeback_month_by_cluster
-- include: chargeback_sums_closed_month
        GROUP BY team, cluster
    )
);
