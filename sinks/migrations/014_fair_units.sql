-- Fair units (issue 19, item 5).
--
-- A MIG instance is priced by its share of the GPU: its compute slices over the GPU's (a 1g.10gb on an H100 is
-- 1 of 7; schemas/mig.py derives it from the profile, processors/rollup.py stamps it on every device-minute).
-- The slice's rate is the generation's rate x slices / of, half-up to the micro-dollar (sinks/ratecard.py
-- `share_rate_micro`), so every charge stays seconds x an integer rate and every grouping adds up. A whole GPU
-- is 1 of 1 (the default: rows stored before this migration are whole GPUs, as they were charged); a MIG
-- instance whose share is unknown is 0 of 1, so it is unpriced and shows in every report's unpriced hours.
-- The share is part of usage_daily's key, so slices of different sizes never sum into one row.
--
-- Reports split by pricing tier: `by = 'tier'` (on-prem, cloud-on-demand, cloud-spot), and every line carries
-- onprem_gpu_h / cloud_gpu_h and onprem_charge / cloud_charge, which add up to the line's `charge`: a line of one
-- kind has all of its charge in that column; a mixed line has its cloud part half-up from its exact numerator
-- and the rest (the line's cent allocation included) on-prem.

ALTER TABLE device_minutes
    ADD COLUMN IF NOT EXISTS mig_profile LowCardinality(String) DEFAULT '' AFTER mig_instance_id,
    ADD COLUMN IF NOT EXISTS gpu_share_slices UInt8 DEFAULT 1 AFTER mig_profile,
    ADD COLUMN IF NOT EXISTS gpu_share_of UInt8 DEFAULT 1 AFTER gpu_share_slices;

-- usage_daily gets the share in its key. A column added to a sorting key may not have a default, and rows
-- stored before this migration must read as whole GPUs (1 of 1), so the table is rebuilt (as 010 rebuilt
-- device_minutes): the materialized view is dropped first and recreated on the new table.
DROP VIEW IF EXISTS usage_daily_mv;

DROP TABLE IF EXISTS usage_daily_shared;

CREATE TABLE usage_daily_shared
(
    day Date,
    cluster String,
    generation LowCardinality(String),
    pricing_tier LowCardinality(String),
    preemptible Bool,
    job_id String,
    user String,
    team String,
    project String,
    cost_centre String,
    mapping_version LowCardinality(String),
    classifier_version LowCardinality(String),
    gpu_share_slices UInt8 DEFAULT 1 COMMENT 'compute slices of the GPU held: 1 of 1 for a whole GPU, 0 of 1 unknown',
    gpu_share_of UInt8 DEFAULT 1 COMMENT 'compute slices of the whole GPU (7 or 4 for a MIG instance)',
    device_minutes UInt64,
    unallocated_s UInt64,
    allocated_s UInt64,
    active_s UInt64,
    starved_s UInt64,
    idle_s UInt64,
    dark_s UInt64,
    sm_weighted_s Float64,
    sample_count UInt64
)
ENGINE = SummingMergeTree
PARTITION BY toYYYYMM(day)
ORDER BY (day, cluster, generation, pricing_tier, preemptible, job_id, user, team, project, cost_centre,
          mapping_version, classifier_version, gpu_share_slices, gpu_share_of);

INSERT INTO usage_daily_shared (day, cluster, generation, pricing_tier, preemptible, job_id, user, team, project, cost_centre, mapping_version,
    classifier_version, device_minutes, unallocated_s, allocated_s, active_s, starved_s, idle_s, dark_s, sm_weighted_s,
    sample_count)
SELECT day, cluster, generation, pricing_tier, preemptible, job_id, user, team, project, cost_centre, mapping_version,
    classifier_version, device_minutes, unallocated_s, allocated_s, active_s, starved_s, idle_s, dark_s, sm_weighted_s,
    sample_count FROM usage_daily;

RENAME TABLE usage_daily TO usage_daily_unshared, usage_daily_shared TO usage_daily;

DROP TABLE usage_daily_unshared;

CREATE MATERIALIZED VIEW IF NOT EXISTS usage_daily_mv TO usage_daily AS
SELECT
    toDate(fromUnixTimestamp64Milli(minute_start_ms, 'UTC')) AS day,
    cluster, generation, pricing_tier, preemptible, job_id, user, team, project, cost_centre,
    mapping_version, classifier_version, gpu_share_slices, gpu_share_of,
    toUInt64(count()) AS device_minutes,
    toUInt64(sum(unallocated_s)) AS unallocated_s,
    toUInt64(sum(allocated_s)) AS allocated_s,
    toUInt64(sum(active_s)) AS active_s,
    toUInt64(sum(starved_s)) AS starved_s,
    toUInt64(sum(idle_s)) AS idle_s,
    toUInt64(sum(dark_s)) AS dark_s,
    sum(sm_weighted_s) AS sm_weighted_s,
    toUInt64(sum(sample_count)) AS sample_count
FROM device_minutes
GROUP BY day, cluster, generation, pricing_tier, preemptible, job_id, user, team, project, cost_centre,
         mapping_version, classifier_version, gpu_share_slices, gpu_share_of;

CREATE OR REPLACE VIEW v_usage_priced AS
SELECT
    u.day AS day,
    formatDateTime(u.day, '%Y-%m') AS period,
    u.cluster AS cluster,
    u.job_id AS job_id,
    u.user AS user,
    u.team AS team,
    if(c.job_id = '', u.project, c.project) AS project,
    u.project AS original_project,
    c.correction_id AS correction_id,
    u.cost_centre AS cost_centre,
    u.generation AS generation,
    u.pricing_tier AS pricing_tier,
    u.preemptible AS preemptible,
    u.allocated_s AS allocated_s,
    u.active_s AS active_s,
    u.starved_s AS starved_s,
    u.idle_s AS idle_s,
    u.dark_s AS dark_s,
    u.sm_weighted_s AS sm_weighted_s,
    u.device_minutes AS device_minutes,
    u.gpu_share_slices AS gpu_share_slices,
    u.gpu_share_of AS gpu_share_of,
    intDiv(toUInt64(r.rate_micro_per_gpu_hour) * u.gpu_share_slices * 2 + u.gpu_share_of, 2 * u.gpu_share_of)
        AS rate_micro,
    toInt128(u.allocated_s) * rate_micro AS charge_num,
    toInt128(u.idle_s) * rate_micro AS idle_charge_num,
    if(rate_micro = 0, u.allocated_s, 0) AS unpriced_s
FROM usage_daily AS u
LEFT JOIN v_project_corrections AS c ON u.cluster = c.cluster AND u.job_id = c.job_id
ASOF LEFT JOIN v_rate_card AS r
    ON u.generation = r.generation AND u.pricing_tier = r.pricing_tier AND u.preemptible = r.preemptible
       AND u.day >= r.effective_from
WHERE u.job_id != '';

CREATE OR REPLACE VIEW v_chargeback AS
SELECT
    period, by, line, jobs,
    toDecimal128(intDiv(alloc_s * 10000 + 1800, 3600), 4) / 10000 AS allocated_gpu_h,
    toDecimal128(floor_cents + if(cent_rank <= leftover_cents, 1, 0), 2) / 100 AS charge,
    toDecimal128(intDiv((act_s + starv_s) * 10000 + 1800, 3600), 4) / 10000 AS consumed_gpu_h,
    if(alloc_s = 0, 0, round(100 * (act_s + starv_s) / alloc_s, 1)) AS utilisation_pct,
    toDecimal128(intDiv(act_s * 10000 + 1800, 3600), 4) / 10000 AS active_gpu_h,
    toDecimal128(intDiv(starv_s * 10000 + 1800, 3600), 4) / 10000 AS starved_gpu_h,
    toDecimal128(intDiv(idl_s * 10000 + 1800, 3600), 4) / 10000 AS idle_gpu_h,
    toDecimal128(intDiv(drk_s * 10000 + 1800, 3600), 4) / 10000 AS dark_gpu_h,
    toDecimal128(intDiv(idle_num + 18000000, 36000000), 2) / 100 AS idle_cost,
    if(alloc_s = 0, 0, round(100 * (alloc_s - drk_s) / alloc_s, 1)) AS coverage_pct,
    toDecimal128(intDiv(unpriced * 10000 + 1800, 3600), 4) / 10000 AS unpriced_gpu_h,
    toDecimal128(intDiv(onprem_s * 10000 + 1800, 3600), 4) / 10000 AS onprem_gpu_h,
    toDecimal128(intDiv((alloc_s - onprem_s) * 10000 + 1800, 3600), 4) / 10000 AS cloud_gpu_h,
    multiIf(alloc_s = onprem_s, toDecimal128(0, 2),
            onprem_s = 0, toDecimal128(floor_cents + if(cent_rank <= leftover_cents, 1, 0), 2) / 100,
            toDecimal128(intDiv(num - onprem_num + 18000000, 36000000), 2) / 100) AS cloud_charge,
    toDecimal128(floor_cents + if(cent_rank <= leftover_cents, 1, 0), 2) / 100 - cloud_charge AS onprem_charge,
    alloc_s AS allocated_seconds,
    act_s AS active_seconds,
    starv_s AS starved_seconds,
    idl_s AS idle_seconds,
    drk_s AS dark_seconds,
    num AS charge_numerator,
    idle_num AS idle_charge_numerator
FROM
(
    SELECT *,
           intDiv(num, 36000000) AS floor_cents,
           row_number() OVER (PARTITION BY period, by ORDER BY num % 36000000 DESC, line) AS cent_rank,
           intDiv(sum(num) OVER (PARTITION BY period, by) + 18000000, 36000000)
               - sum(intDiv(num, 36000000)) OVER (PARTITION BY period, by) AS leftover_cents
    FROM
    (
        SELECT period, by, line,
               uniqExact(cluster, job_id) AS jobs,
               toInt128(sum(allocated_s)) AS alloc_s,
               toInt128(sum(active_s)) AS act_s,
               toInt128(sum(starved_s)) AS starv_s,
               toInt128(sum(idle_s)) AS idl_s,
               toInt128(sum(dark_s)) AS drk_s,
               toInt128(sum(unpriced_s)) AS unpriced,
               toInt128(sumIf(allocated_s, pricing_tier = 'on-prem')) AS onprem_s,
               sumIf(charge_num, pricing_tier = 'on-prem') AS onprem_num,
               sum(charge_num) AS num,
               sum(idle_charge_num) AS idle_num
        FROM
        (
            SELECT period, cluster, job_id, pricing_tier, allocated_s, active_s, starved_s, idle_s, dark_s, charge_num,
                   idle_charge_num, unpriced_s, pair.1 AS by, pair.2 AS line
            FROM v_usage_priced
            ARRAY JOIN [('team', team), ('project', project), ('user', user), ('cost-centre', cost_centre),
                        ('tier', pricing_tier)] AS pair
        )
        GROUP BY period, by, line
    )
);

CREATE OR REPLACE VIEW v_chargeback_month AS
SELECT
    period, by, line, jobs,
    toDecimal128(intDiv(alloc_s * 10000 + 1800, 3600), 4) / 10000 AS allocated_gpu_h,
    toDecimal128(floor_cents + if(cent_rank <= leftover_cents, 1, 0), 2) / 100 AS charge,
    toDecimal128(intDiv((act_s + starv_s) * 10000 + 1800, 3600), 4) / 10000 AS consumed_gpu_h,
    if(alloc_s = 0, 0, round(100 * (act_s + starv_s) / alloc_s, 1)) AS utilisation_pct,
    toDecimal128(intDiv(act_s * 10000 + 1800, 3600), 4) / 10000 AS active_gpu_h,
    toDecimal128(intDiv(starv_s * 10000 + 1800, 3600), 4) / 10000 AS starved_gpu_h,
    toDecimal128(intDiv(idl_s * 10000 + 1800, 3600), 4) / 10000 AS idle_gpu_h,
    toDecimal128(intDiv(drk_s * 10000 + 1800, 3600), 4) / 10000 AS dark_gpu_h,
    toDecimal128(intDiv(idle_num + 18000000, 36000000), 2) / 100 AS idle_cost,
    if(alloc_s = 0, 0, round(100 * (alloc_s - drk_s) / alloc_s, 1)) AS coverage_pct,
    toDecimal128(intDiv(unpriced * 10000 + 1800, 3600), 4) / 10000 AS unpriced_gpu_h,
    toDecimal128(intDiv(onprem_s * 10000 + 1800, 3600), 4) / 10000 AS onprem_gpu_h,
    toDecimal128(intDiv((alloc_s - onprem_s) * 10000 + 1800, 3600), 4) / 10000 AS cloud_gpu_h,
    multiIf(alloc_s = onprem_s, toDecimal128(0, 2),
            onprem_s = 0, toDecimal128(floor_cents + if(cent_rank <= leftover_cents, 1, 0), 2) / 100,
            toDecimal128(intDiv(num - onprem_num + 18000000, 36000000), 2) / 100) AS cloud_charge,
    toDecimal128(floor_cents + if(cent_rank <= leftover_cents, 1, 0), 2) / 100 - cloud_charge AS onprem_charge,
    alloc_s AS allocated_seconds,
    act_s AS active_seconds,
    starv_s AS starved_seconds,
    idl_s AS idle_seconds,
    drk_s AS dark_seconds,
    num AS charge_numerator,
    idle_num AS idle_charge_numerator
FROM
(
    SELECT *,
           intDiv(num, 36000000) AS floor_cents,
           row_number() OVER (ORDER BY num % 36000000 DESC, line) AS cent_rank,
           intDiv(sum(num) OVER () + 18000000, 36000000) - sum(intDiv(num, 36000000)) OVER () AS leftover_cents
    FROM
    (
        SELECT {period:String} AS period, {by:String} AS by,
               multiIf({by:String} = 'team', team, {by:String} = 'project', project,
                       {by:String} = 'user', user, {by:String} = 'tier', pricing_tier, cost_centre) AS line,
               uniqExact(cluster, job_id) AS jobs,
               toInt128(sum(allocated_s)) AS alloc_s,
               toInt128(sum(active_s)) AS act_s,
               toInt128(sum(starved_s)) AS starv_s,
               toInt128(sum(idle_s)) AS idl_s,
               toInt128(sum(dark_s)) AS drk_s,
               toInt128(sum(unpriced_s)) AS unpriced,
               toInt128(sumIf(allocated_s, pricing_tier = 'on-prem')) AS onprem_s,
               sumIf(charge_num, pricing_tier = 'on-prem') AS onprem_num,
               sum(charge_num) AS num,
               sum(idle_charge_num) AS idle_num
        FROM v_usage_priced
        WHERE day >= toDate(concat({period:String}, '-01'))
          AND day < addMonths(toDate(concat({period:String}, '-01')), 1)
        GROUP BY line
    )
);

CREATE OR REPLACE VIEW v_statement_month AS
SELECT
    period, by, line, jobs,
    toDecimal128(intDiv(alloc_s * 10000 + 1800, 3600), 4) / 10000 AS allocated_gpu_h,
    toDecimal128(floor_cents + if(cent_rank <= leftover_cents, 1, 0), 2) / 100 AS charge,
    toDecimal128(intDiv((act_s + starv_s) * 10000 + 1800, 3600), 4) / 10000 AS consumed_gpu_h,
    if(alloc_s = 0, 0, round(100 * (act_s + starv_s) / alloc_s, 1)) AS utilisation_pct,
    toDecimal128(intDiv(act_s * 10000 + 1800, 3600), 4) / 10000 AS active_gpu_h,
    toDecimal128(intDiv(starv_s * 10000 + 1800, 3600), 4) / 10000 AS starved_gpu_h,
    toDecimal128(intDiv(idl_s * 10000 + 1800, 3600), 4) / 10000 AS idle_gpu_h,
    toDecimal128(intDiv(drk_s * 10000 + 1800, 3600), 4) / 10000 AS dark_gpu_h,
    toDecimal128(intDiv(idle_num + 18000000, 36000000), 2) / 100 AS idle_cost,
    if(alloc_s = 0, 0, round(100 * (alloc_s - drk_s) / alloc_s, 1)) AS coverage_pct,
    toDecimal128(intDiv(unpriced * 10000 + 1800, 3600), 4) / 10000 AS unpriced_gpu_h,
    toDecimal128(intDiv(onprem_s * 10000 + 1800, 3600), 4) / 10000 AS onprem_gpu_h,
    toDecimal128(intDiv((alloc_s - onprem_s) * 10000 + 1800, 3600), 4) / 10000 AS cloud_gpu_h,
    multiIf(alloc_s = onprem_s, toDecimal128(0, 2),
            onprem_s = 0, toDecimal128(floor_cents + if(cent_rank <= leftover_cents, 1, 0), 2) / 100,
            toDecimal128(intDiv(num - onprem_num + 18000000, 36000000), 2) / 100) AS cloud_charge,
    toDecimal128(floor_cents + if(cent_rank <= leftover_cents, 1, 0), 2) / 100 - cloud_charge AS onprem_charge,
    alloc_s AS allocated_seconds,
    act_s AS active_seconds,
    starv_s AS starved_seconds,
    idl_s AS idle_seconds,
    drk_s AS dark_seconds,
    num AS charge_numerator,
    idle_num AS idle_charge_numerator
FROM
(
    SELECT *,
           intDiv(num, 36000000) AS floor_cents,
           row_number() OVER (ORDER BY num % 36000000 DESC, line) AS cent_rank,
           intDiv(sum(num) OVER () + 18000000, 36000000) - sum(intDiv(num, 36000000)) OVER () AS leftover_cents
    FROM
    (
        SELECT {period:String} AS period, {by:String} AS by,
               multiIf({by:String} = 'team', team, {by:String} = 'project', project,
                       {by:String} = 'user', user, {by:String} = 'tier', pricing_tier, cost_centre) AS line,
               uniqExact(cluster, job_id) AS jobs,
               toInt128(sum(allocated_s)) AS alloc_s,
               toInt128(sum(active_s)) AS act_s,
               toInt128(sum(starved_s)) AS starv_s,
               toInt128(sum(idle_s)) AS idl_s,
               toInt128(sum(dark_s)) AS drk_s,
               toInt128(sum(unpriced_s)) AS unpriced,
               toInt128(sumIf(allocated_s, pricing_tier = 'on-prem')) AS onprem_s,
               sumIf(charge_num, pricing_tier = 'on-prem') AS onprem_num,
               sum(charge_num) AS num,
               sum(toInt128(idle_s) * rate_micro_per_gpu_hour) AS idle_num
        FROM v_statement_lines
        WHERE period = {period:String} AND kind = 'usage'
        GROUP BY line
    )
);
