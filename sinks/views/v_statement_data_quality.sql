-- 024's view, in full: its `*` now reads the two columns above.
CREATE OR REPLACE VIEW v_statement_data_quality AS
SELECT * FROM statement_data_quality FINAL
WHERE statement_id IN (SELECT statement_id FROM v_statements);
