-- Schema version 8: what may serve is decided by conditions in the views, never by rewriting
-- rows, so that a record merged or recorded later is judged by the same rules as the others.
-- `unverified`: a record merged from elsewhere (`gemmgen db merge`); its times were measured on
-- another machine and are not trusted, so it never serves, and tuning measures its program again.
-- `toolchain`: the driver and the versions that built and launched the kernel
-- (records.toolchain_of, filled for older rows from their device); a lookup given this machine's
-- versions serves only winners measured under them.
-- The arrival-order split-K trials that migration 007 marked `superseded` once are excluded by a
-- condition in `current_trials`: an export written before 007, merged back, cannot win again.

ALTER TABLE trials ADD COLUMN unverified INTEGER NOT NULL DEFAULT 0;
ALTER TABLE trials ADD COLUMN toolchain TEXT NOT NULL DEFAULT '';
ALTER TABLE library_choices ADD COLUMN unverified INTEGER NOT NULL DEFAULT 0;

DROP VIEW winners;
DROP VIEW library_winners;

-- Trials of a kernel gemmgen builds today, measured by this database's own runs: the ones that
-- may win, and the ones resume skips.
CREATE VIEW current_trials AS
SELECT * FROM trials
WHERE unverified = 0 AND status != 'superseded'
  AND NOT (backend = 'triton' AND created < '2026-11-30T01:00:00'
           AND (program LIKE '%split_k % unordered%' OR program LIKE '%split_k % atomic%'));

-- Every trial that may win: passed its check and beat its run's best baseline beyond its noise
-- (or, before schema 6, its spread); once a problem has trials timed beside torch.matmul in
-- their own session on a GPU, only those.
CREATE VIEW winning_trials AS
SELECT t.*, p.key AS problem_key, d.name AS device_name,
       t.best_baseline_ms / t.device_ms AS speedup
FROM current_trials t
JOIN problems p ON p.id = t.problem_id
JOIN devices d ON d.id = t.device_id
WHERE t.status = 'ok' AND t.check_passed = 1
  AND t.device_ms > 0 AND t.best_baseline_ms > 0 AND COALESCE(t.noise, t.spread) IS NOT NULL
  AND t.device_ms * (1.0 + COALESCE(t.noise, t.spread)) < t.best_baseline_ms
  AND (instr(t.baselines, '"torch_same_session"') > 0
       OR NOT EXISTS (
           SELECT 1 FROM current_trials s JOIN devices ds ON ds.id = s.device_id
           WHERE s.problem_id = t.problem_id AND ds.name = d.name
             AND instr(s.baselines, '"torch_same_session"') > 0));

-- The largest speedup wins (ties: the earlier trial), per problem and device name, whatever the
-- toolchain; queries.SELECT_WINNERS_UNDER ranks only those measured under given versions.
CREATE VIEW winners AS
SELECT * FROM (
    SELECT w.*, ROW_NUMBER() OVER (
               PARTITION BY w.problem_id, w.device_name ORDER BY w.speedup DESC, w.id
           ) AS rank
    FROM winning_trials w
) WHERE rank = 1;

CREATE VIEW library_winners AS
SELECT * FROM (
    SELECT c.*, p.key AS problem_key, d.name AS device_name,
           c.torch_ms / c.device_ms AS speedup,
           ROW_NUMBER() OVER (
               PARTITION BY c.problem_id, d.name, c.library, c.version
               ORDER BY c.created DESC, c.id DESC
           ) AS rank
    FROM library_choices c
    JOIN problems p ON p.id = c.problem_id
    JOIN devices d ON d.id = c.device_id
    WHERE c.unverified = 0
) WHERE rank = 1 AND check_passed = 1 AND device_ms > 0 AND torch_ms > 0
    AND COALESCE(noise, spread) IS NOT NULL AND device_ms * (1.0 + COALESCE(noise, spread)) < torch_ms
    AND (server_ms IS NULL OR torch_server_ms IS NULL
         OR server_ms * (1.0 - COALESCE(server_noise, 0.0)) <= torch_server_ms);
