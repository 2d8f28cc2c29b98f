-- Notes from migration 021_finance_journal_balanced, moved here with the view:
-- The finance journal in SQL (issue 19): `report journal`'s lines, balancing to zero, for analysts.
--
--   SELECT * FROM v_finance_journal_balanced(period = '2026-11', account = 'GPU-CHARGEBACK',
--            contra_account = 'GPU-CHARGEBACK', contra_cost_centre = 'CLUSTER-sim') ORDER BY line_no
--
-- A new view beside v_finance_journal (003), not a replacement: 003's view is a plain view with one debit per
-- cost centre and period and its own columns (idle_cost), which analysts' queries already select from; the
-- journal's line ids hash the account and the contra's cost centre, which only the caller knows (the CLI's
-- --account, --contra-account, --contra-cost-centre), so this one takes them as parameters, with the month,
-- as v_statement_month does.
--
-- What it computes is sinks/journal.py's build_journal over the month's statements:
--   * a closed month: its frozen lines (v_statement_lines), every kind: usage, adjustment, credit, reservation;
--   * an open month (status 'provisional'): its usage lines, their cents allocated as sinks/statements.py's
--     usage_lines does (the report's team totals, then each team's lines by largest remainder, ties by the
--     line's id), and the adjustments of the closed months it would post now (pending_adjustments: the ledger
--     now, minus the frozen usage, minus what later closed statements posted; cause correction, late-data or
--     rate-card). Not the credits and reservation charges an open month would carry: those come from the
--     appeal and reservation steps judged under the policy file (schemas/governance_*.py), which SQL does not
--     read; they are here once the month is closed, and `report journal` shows them provisionally.
-- Then one line per (kind, cost centre, source month, cause) and one contra line, to contra_cost_centre,
-- for minus the sum of the others. `line_id` is the CLI's (sha256 of the JSON array of period, kind, cost
-- centre, account, source month, cause kind and ref, escaped as Python's json.dumps does); `statement_ids` is
-- empty on an open month (a statement's id hashes its whole content, known only when it closes);
-- `line_no` is the CLI's order.
--
CREATE OR REPLACE VIEW v_finance_journal_balanced AS
WITH
    -- A string as json.dumps writes it (ensure_ascii): \" \\ \n \r \t \b \f, other control characters and
    -- everything past ASCII as \uXXXX (surrogate pairs past the BMP). Byte values from UTF-8 by hand.
    (s -> concat('"', arrayStringConcat(arrayMap(t -> multiIf(
        t.1 = '"', '\\"', t.1 = '\\', '\\\\', t.1 = char(10), '\\n', t.1 = char(13), '\\r', t.1 = char(9), '\\t',
        t.1 = char(8), '\\b', t.1 = char(12), '\\f',
        t.2 < 32 OR t.2 = 127, concat('\\u', leftPad(lower(hex(toUInt16(t.2))), 4, '0')),
        t.2 < 128, t.1,
        t.2 < 65536, concat('\\u', leftPad(lower(hex(toUInt16(t.2))), 4, '0')),
        concat('\\u', leftPad(lower(hex(toUInt16(55296 + bitShiftRight(t.2 - 65536, 10)))), 4, '0'),
               '\\u', leftPad(lower(hex(toUInt16(56320 + bitAnd(t.2 - 65536, 1023)))), 4, '0'))),
        arrayMap(c -> (c, multiIf(
            length(c) = 1, toUInt32(reinterpretAsUInt8(c)),
            length(c) = 2, bitOr(bitShiftLeft(bitAnd(toUInt32(reinterpretAsUInt8(substring(c, 1, 1))), 31), 6),
                                 bitAnd(toUInt32(reinterpretAsUInt8(substring(c, 2, 1))), 63)),
            length(c) = 3, bitOr(bitOr(bitShiftLeft(bitAnd(toUInt32(reinterpretAsUInt8(substring(c, 1, 1))), 15), 12),
                                       bitShiftLeft(bitAnd(toUInt32(reinterpretAsUInt8(substring(c, 2, 1))), 63), 6)),
                                 bitAnd(toUInt32(reinterpretAsUInt8(substring(c, 3, 1))), 63)),
            bitOr(bitOr(bitOr(bitShiftLeft(bitAnd(toUInt32(reinterpretAsUInt8(substring(c, 1, 1))), 7), 18),
                              bitShiftLeft(bitAnd(toUInt32(reinterpretAsUInt8(substring(c, 2, 1))), 63), 12)),
                        bitShiftLeft(bitAnd(toUInt32(reinterpretAsUInt8(substring(c, 3, 1))), 63), 6)),
                  bitAnd(toUInt32(reinterpretAsUInt8(substring(c, 4, 1))), 63)))),
            extractAll(s, '(?s).'))), ''), '"')) AS json_str,
    -- Python's json.dumps of a list of strings (the journal's line identity).
    (ss -> concat('[', arrayStringConcat(arrayMap(x -> json_str(x), ss), ', '), ']')) AS json_list,
    (text -> substring(lower(hex(SHA256(text))), 1, 24)) AS short_hash,
    -- Decimal text with 4 places, as Python prints gpu_hours(); half away from zero like ROUND_HALF_UP.
    (secs -> toDecimal128(sign(secs) * intDiv(abs(secs) * 10000 + 1800, 3600), 4) / 10000) AS gpu_h,
    {period:String} AS journal_period,
    journal_period IN (SELECT period FROM v_period_closes) AS journal_closed,
    -- An open month posts the closed months' adjustments only while no earlier month with usage is open.
    journal_closed = 0 AND (
        SELECT count() FROM (SELECT DISTINCT formatDateTime(day, '%Y-%m') AS m FROM usage_daily WHERE job_id != '')
        WHERE m < {period:String} AND m NOT IN (SELECT period FROM v_period_closes)) = 0 AS posts_adjustments,
    (SELECT any(card_version) FROM v_rate_card) AS card_version_now,
    -- An open month's usage lines (sinks/statements.py usage_lines): one per job and rate; the team's cents are
    -- allocate_cents over the teams (the month's total half-up, floors, the leftover cents to the largest
    -- remainders, ties by team), then allocate_to_total over the team's lines (ties by the line's id).
    usage_open AS (
        SELECT '' AS statement_id, line_id, team, 'usage' AS kind, journal_period AS source_period, cluster, job_id,
               cost_centre, '' AS cause_kind, '' AS cause_ref,
               toInt64(intDiv(num, 36000000)
                       + if(rank_in_team <= intDiv(team_num, 36000000) + if(team_rank <= leftover, 1, 0)
                                            - floors_in_team, 1, 0)) AS cents,
               toInt64(alloc) AS allocated_s
        FROM
        (
            SELECT *,
                   row_number() OVER (PARTITION BY team ORDER BY num % 36000000 DESC, line_id) AS rank_in_team,
                   sum(intDiv(num, 36000000)) OVER (PARTITION BY team) AS floors_in_team,
                   dense_rank() OVER (ORDER BY team_num % 36000000 DESC, team) AS team_rank,
                   intDiv(sum(num) OVER () + 18000000, 36000000)
                       - sum(if(first_of_team, intDiv(team_num, 36000000), 0)) OVER () AS leftover
            FROM
            (
                SELECT *,
                       sum(num) OVER (PARTITION BY team) AS team_num,
                       row_number() OVER (PARTITION BY team) = 1 AS first_of_team,
                       short_hash(concat(substring(json_list(['usage', team, journal_period, cluster, job_id, user,
                                                               project, original_project, correction_id, cost_centre,
                                                               generation, pricing_tier]), 1, -1),
                                         ', ', if(preemptible, 'true', 'false'), ', ', toString(rate_micro),
                                         ', "", ""]')) AS line_id
                FROM
                (
                    SELECT team, cluster, job_id, user, project, original_project, correction_id, cost_centre,
                           generation, pricing_tier, preemptible, rate_micro,
                           toInt128(sum(allocated_s)) AS alloc, sum(charge_num) AS num
                    FROM v_usage_priced
                    WHERE period = {period:String} AND NOT journal_closed
                    GROUP BY team, cluster, job_id, user, project, original_project, correction_id, cost_centre,
                             generation, pricing_tier, preemptible, rate_micro
                )
            )
        )
    ),
    -- An open month's adjustments (sinks/statements.py pending_adjustments), per closed month before it and
    -- adjustment key: the ledger now - the frozen usage - the adjustments later closed statements posted, where
    -- any quantity differs. Cause: the job's correction when it is not the one its closed figures reflect (the
    -- frozen line's, then the last a posted adjustment named), else late-data when seconds changed, else
    -- rate-card with the card now loaded. Cents: the exact difference, half away from zero.
    adjustments_open AS (
        SELECT '' AS statement_id,
               short_hash(concat(substring(json_list(['adjustment', team, source_period, cluster, job_id, user,
                                                       project, '', '', cost_centre, generation, pricing_tier]),
                                           1, -1),
                                 ', ', if(preemptible, 'true', 'false'), ', 0, ', json_str(cause_kind), ', ',
                                 json_str(cause_ref), ']')) AS line_id,
               team, 'adjustment' AS kind, source_period, cluster, job_id, cost_centre, cause_kind, cause_ref,
               toInt64(if(num >= 0, intDiv(num + 18000000, 36000000), -intDiv(18000000 - num, 36000000))) AS cents,
               toInt64(alloc) AS allocated_s
        FROM
        (
            SELECT *,
                   known AND now_correction != accounted AS by_correction,
                   multiIf(by_correction, 'correction', alloc != 0, 'late-data', 'rate-card') AS cause_kind,
                   multiIf(by_correction, now_correction, alloc != 0, '', card_version_now) AS cause_ref
            FROM
            (
                SELECT *,
                       max(key_now_correction) OVER job AS now_correction,
                       argMax(key_accounted, key_accounted_order) OVER job AS accounted,
                       max(key_known) OVER job AS known
                FROM
                (
                    SELECT source_period, team, cluster, job_id, user, project, cost_centre, generation, pricing_tier,
                           preemptible, sum(q_alloc) AS alloc, sum(q_active) AS active, sum(q_starved) AS starved,
                           sum(q_idle) AS idle, sum(q_dark) AS dark, sum(q_unpriced) AS unpriced, sum(q_num) AS num,
                           max(now_corr) AS key_now_correction,
                           argMax(acc_ref, acc_order) AS key_accounted, max(acc_order) AS key_accounted_order,
                           max(has_acc) AS key_known
                    FROM
                    (
                        SELECT period AS source_period, team, cluster, job_id, user, project, cost_centre, generation,
                               pricing_tier, preemptible, toInt128(allocated_s) AS q_alloc,
                               toInt128(active_s) AS q_active, toInt128(starved_s) AS q_starved,
                               toInt128(idle_s) AS q_idle, toInt128(dark_s) AS q_dark,
                               toInt128(unpriced_s) AS q_unpriced, toInt128(charge_num) AS q_num,
                               correction_id AS now_corr, '' AS acc_ref, tuple(-1, '', '', '') AS acc_order,
                               0 AS has_acc
                        FROM v_usage_priced
                        WHERE posts_adjustments AND period < {period:String}
                              AND period IN (SELECT period FROM v_period_closes)

                        UNION ALL

                        SELECT if(kind = 'usage', period, source_period) AS source_period, team, cluster, job_id, user,
                               project, cost_centre, generation, pricing_tier, preemptible,
                               -toInt128(allocated_s), -toInt128(active_s), -toInt128(starved_s), -toInt128(idle_s),
                               -toInt128(dark_s), -toInt128(unpriced_s), -toInt128(charge_num),
                               '' AS now_corr,
                               if(kind = 'usage', correction_id, cause_ref) AS acc_ref,
                               multiIf(kind = 'usage', tuple(0, '', '', ''),
                                       cause_kind = 'correction', tuple(1, period, statement_id, line_id),
                                       tuple(-1, '', '', '')) AS acc_order,
                               kind = 'usage' OR cause_kind = 'correction' AS has_acc
                        FROM v_statement_lines
                        WHERE posts_adjustments
                              AND ((kind = 'usage' AND period < {period:String})
                                   OR (kind = 'adjustment' AND source_period < {period:String}
                                       AND period > source_period))
                    )
                    GROUP BY source_period, team, cluster, job_id, user, project, cost_centre, generation,
                             pricing_tier, preemptible
                )
                WINDOW job AS (PARTITION BY source_period, cluster, job_id)
            )
            WHERE alloc != 0 OR active != 0 OR starved != 0 OR idle != 0 OR dark != 0 OR unpriced != 0 OR num != 0
        )
    ),
    -- The month's statement lines: a closed month's frozen ones, else the usage and adjustments above.
    month_lines AS (
        SELECT statement_id, line_id, team, toString(kind) AS kind, source_period, cluster, job_id, cost_centre,
               toString(cause_kind) AS cause_kind, cause_ref, toInt64(charge * 100) AS cents,
               toInt64(allocated_s) AS allocated_s
        FROM v_statement_lines
        WHERE period = {period:String} AND journal_closed
        UNION ALL
        SELECT * FROM usage_open
        UNION ALL
        SELECT * FROM adjustments_open
    ),
    -- A line without a cost centre (sinks/journal.py _cost_centre): usage is UNASSIGNED; any other line takes its
    -- job's (the closed usage lines' earliest month's, else the month's first line naming one, by team and line
    -- id), else its team's when the team's lines name exactly one, else UNASSIGNED.
    charged AS (
        SELECT statement_id, kind, source_period, cluster, job_id, cause_kind, cause_ref, cents, allocated_s,
               multiIf(cost_centre != '', cost_centre, kind = 'usage', 'UNASSIGNED',
                       job_id != '' AND closed_job_cc != '', closed_job_cc,
                       job_id != '' AND month_job_cc != '', month_job_cc,
                       team_ccs = 1, team_cc, 'UNASSIGNED') AS journal_cc
        FROM
        (
            SELECT *,
                   argMinIf(cost_centre, tuple(team, line_id), cost_centre != '')
                       OVER (PARTITION BY cluster, job_id) AS month_job_cc,
                   uniqExactIf(cost_centre, cost_centre != '') OVER (PARTITION BY team) AS team_ccs,
                   anyIf(cost_centre, cost_centre != '') OVER (PARTITION BY team) AS team_cc
            FROM month_lines
        ) AS l
        LEFT JOIN
        (
            SELECT cluster, job_id, argMin(cost_centre, period) AS closed_job_cc
            FROM v_statement_lines
            WHERE kind = 'usage' AND cost_centre != ''
            GROUP BY cluster, job_id
        ) AS cj USING (cluster, job_id)
    ),
    -- One journal line per (kind, cost centre, source month, cause) in the CLI's order, with the month's totals
    -- the contra needs.
    grouped AS (
        SELECT *,
               row_number() OVER (ORDER BY kind != 'usage', cost_centre,
                                  indexOf(['usage', 'adjustment', 'credit', 'reservation'], kind),
                                  source_period, cause_kind, cause_ref) AS line_no,
               count() OVER () AS lines,
               sum(cents) OVER () AS month_cents,
               sum(if(kind = 'usage', allocated_s, 0)) OVER () AS usage_s,
               length(arrayDistinct(arrayFlatten(groupArray(usage_jobs) OVER ()))) AS month_jobs
        FROM
        (
            SELECT kind, journal_cc AS cost_centre, source_period, cause_kind, cause_ref,
                   sum(cents) AS cents, sum(allocated_s) AS allocated_s,
                   uniqExactIf(tuple(cluster, job_id), job_id != '') AS jobs,
                   groupUniqArrayIf(tuple(cluster, job_id), job_id != '' AND kind = 'usage') AS usage_jobs,
                   arrayStringConcat(arraySort(groupUniqArrayIf(statement_id, statement_id != '')), ';')
                       AS statement_ids
            FROM charged
            GROUP BY kind, journal_cc, source_period, cause_kind, cause_ref
        )
    ),
    -- Each line, and after the last one the contra: minus the sum of all the others.
    journal AS (
        SELECT if(contra, 'contra', kind) AS j_kind,
               if(contra, {contra_cost_centre:String}, cost_centre) AS j_cost_centre,
               if(contra, {contra_account:String}, {account:String}) AS j_account,
               if(contra, -month_cents, cents) AS j_cents,
               if(contra, journal_period, source_period) AS j_source_period,
               if(contra, '', cause_kind) AS j_cause_kind,
               if(contra, '', cause_ref) AS j_cause_ref,
               if(contra, (SELECT arrayStringConcat(arraySort(groupArray(statement_id)), ';') FROM v_statements
                           WHERE period = {period:String} AND journal_closed), statement_ids) AS j_statement_ids,
               if(contra, usage_s, allocated_s) AS j_allocated_s,
               if(contra, month_jobs, jobs) AS j_jobs,
               line_no + contra AS j_line_no,
               lines
        FROM grouped
        ARRAY JOIN if(line_no = lines, [0, 1], [0]) AS contra
    )
SELECT
    journal_period AS period,
    if(journal_closed, 'closed', 'provisional') AS status,
    short_hash(json_list([journal_period, j_kind, j_cost_centre, j_account, j_source_period, j_cause_kind,
                          j_cause_ref])) AS line_id,
    j_kind AS line_kind,
    j_cost_centre AS cost_centre,
    j_account AS account,
    toDecimal128(greatest(j_cents, 0), 2) / 100 AS debit,
    toDecimal128(greatest(-j_cents, 0), 2) / 100 AS credit,
    toDecimal128(j_cents, 2) / 100 AS amount,
    j_source_period AS source_period,
    j_cause_kind AS cause_kind,
    j_cause_ref AS cause_ref,
    j_statement_ids AS statement_ids,
    multiIf(j_kind = 'usage',
            concat('GPU allocation ', journal_period, ': ', toDecimalString(gpu_h(j_allocated_s), 4), ' GPU-h over ',
                   toString(j_jobs), ' jobs'),
            j_kind = 'contra', concat('GPU chargeback ', journal_period, ': contra of ', toString(lines), ' lines'),
            concat(upper(substring(j_kind, 1, 1)), substring(j_kind, 2), ' to ', j_source_period, ' posted in ',
                   journal_period, ': ', trimBoth(concat(j_cause_kind, ' ', j_cause_ref)))) AS description,
    gpu_h(j_allocated_s) AS allocated_gpu_h,
    j_jobs AS jobs,
    j_line_no AS line_no
FROM journal;
