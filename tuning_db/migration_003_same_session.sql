-- Schema version 3: trials timed beside torch.matmul in their own worker session (the
-- baseline `torch_same_session`) supersede the older trials of the same problem on the same
-- GPU. The older ones compared the kernel, timed in the worker, with baselines timed by the
-- tuning process minutes apart; on the H200 every winner above 1 GFLOP measured that way lost
-- its lead against torch.matmul timed beside it.

DROP VIEW winners;

CREATE VIEW winners AS
SELECT * FROM (
    SELECT t.*, p.key AS problem_key, d.name AS device_name,
           t.best_baseline_ms / t.device_ms AS speedup,
           ROW_NUMBER() OVER (
               PARTITION BY t.problem_id, d.name
               ORDER BY t.best_baseline_ms / t.device_ms DESC, t.id
           ) AS rank
    FROM trials t
    JOIN problems p ON p.id = t.problem_id
    JOIN devices d ON d.id = t.device_id
    WHERE t.status = 'ok' AND t.check_passed = 1
      AND t.device_ms > 0 AND t.best_baseline_ms > 0 AND t.spread IS NOT NULL
      AND t.device_ms * (1.0 + t.spread) < t.best_baseline_ms
      AND (instr(t.baselines, '"torch_same_session"') > 0
           OR NOT EXISTS (
               SELECT 1 FROM trials s JOIN devices ds ON ds.id = s.device_id
               WHERE s.problem_id = t.problem_id AND ds.name = d.name
                 AND instr(s.baselines, '"torch_same_session"') > 0))
) WHERE rank = 1;
