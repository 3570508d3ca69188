-- Schema version 6: the noise of a program's speedup over torch.matmul timed beside it in its
-- own worker session (paired rounds, floored at the session-to-session noise: what schema 5
-- gave library choices). A trial with it wins if its time plus that noise is under the best
-- baseline; older trials keep their spread (p10-p90 of the kernel's own time). At 2-3 us the
-- spread is 6-10 % of clock and launch jitter that kernel and torch.matmul share: on the H200
-- the 109-shape sample's programs at 64x256x128 (1.10x torch.matmul beside it) and 512x128x256
-- (1.13x) could not serve under it.

ALTER TABLE trials ADD COLUMN noise REAL;

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
      AND t.device_ms > 0 AND t.best_baseline_ms > 0 AND COALESCE(t.noise, t.spread) IS NOT NULL
      AND t.device_ms * (1.0 + COALESCE(t.noise, t.spread)) < t.best_baseline_ms
      AND (instr(t.baselines, '"torch_same_session"') > 0
           OR NOT EXISTS (
               SELECT 1 FROM trials s JOIN devices ds ON ds.id = s.device_id
               WHERE s.problem_id = t.problem_id AND ds.name = d.name
                 AND instr(s.baselines, '"torch_same_session"') > 0))
) WHERE rank = 1;
