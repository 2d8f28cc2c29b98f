CREATE OR REPLACE VIEW v_statement_lines AS
SELECT * FROM statement_lines FINAL
WHERE statement_id IN (SELECT statement_id FROM v_statements);
