CREATE OR REPLACE VIEW v_rate_card AS
SELECT generation, pricing_tier, preemptible, effective_from, rate_micro_per_gpu_hour,
       toDecimal64(rate_micro_per_gpu_hour, 6) / 1000000 AS rate_per_gpu_hour, basis, card_version
FROM rate_card FINAL
WHERE loaded_ms = (SELECT max(loaded_ms) FROM rate_card);
