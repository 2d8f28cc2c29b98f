-- Each reclaim action with how it ended: the latest outcome row per action.
CREATE OR REPLACE VIEW v_actions AS
SELECT a.action_id AS action_id, a.ts_ms AS ts_ms, a.cluster AS cluster, a.job_id AS job_id,
       a.scheduler AS scheduler, a.action AS action, a.dry_run AS requested_dry_run, a.reason AS reason,
       a.user AS user, a.project AS project,
       o.last_status AS outcome, o.last_detail AS outcome_detail, o.steps AS steps_recorded
FROM actions AS a FINAL
LEFT JOIN
(
    SELECT action_id, argMax(status, (ts_ms, step)) AS last_status, argMax(detail, (ts_ms, step)) AS last_detail,
           count() AS steps
    FROM action_outcomes FINAL
    GROUP BY action_id
) AS o ON a.action_id = o.action_id;
