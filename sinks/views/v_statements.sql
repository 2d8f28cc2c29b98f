CREATE OR REPLACE VIEW v_statements AS
SELECT * FROM statements FINAL
WHERE close_id IN (SELECT close_id FROM v_period_closes);
