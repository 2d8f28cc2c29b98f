CREATE OR REPLACE VIEW v_period_closes AS
SELECT period, first.1 AS closed_ms, first.2 AS close_id, first.3 AS closed_by, first.4 AS statements,
       first.5 AS total_charge
FROM
(
    SELECT period, argMin(tuple(closed_ms, close_id, closed_by, statements, total_charge), tuple(closed_ms, close_id))
           AS first
    FROM period_closes FINAL
    GROUP BY period
);
