-- A chargeback line's sums over its priced rows (v_usage_priced's, or a closed month's frozen lines), as
-- Int128 seconds and the charge numerator (seconds x micro-units per GPU-hour); chargeback_line_columns
-- makes the columns from them. The view gives its `jobs` before and its `idle_num` after.
               toInt128(sum(allocated_s)) AS alloc_s,
               toInt128(sum(active_s)) AS act_s,
               toInt128(sum(starved_s)) AS starv_s,
               toInt128(sum(idle_s)) AS idl_s,
               toInt128(sum(dark_s)) AS drk_s,
               toInt128(sum(unpriced_s)) AS unpriced,
               toInt128(sumIf(allocated_s, pricing_tier = 'on-prem')) AS onprem_s,
               sumIf(charge_num, pricing_tier = 'on-prem') AS onprem_num,
               sum(charge_num) AS num,
