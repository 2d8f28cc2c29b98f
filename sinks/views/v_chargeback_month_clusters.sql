-- v_chargeback_month's columns, one line per (team, cluster); the cents allocated over the month's lines.
CREATE OR REPLACE VIEW v_chargeback_month_clusters AS
-- include: chargeback_month_by_cluster
-- include: chargeback_sums_open_month
        GROUP BY team, cluster
    )
);
