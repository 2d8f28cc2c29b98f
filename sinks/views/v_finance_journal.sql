-- Finance journal: one debit line per cost centre and period (charged on allocation).
CREATE OR REPLACE VIEW v_finance_journal AS
SELECT period, line AS cost_centre, jobs, allocated_gpu_h, charge, idle_cost
FROM v_chargeback
WHERE by = 'cost-centre';
