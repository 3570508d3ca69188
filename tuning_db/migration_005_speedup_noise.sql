-- Schema version 5: the noise of a library choice's speedup over torch.matmul, measured from
-- the two times' paired rounds and floored at the session-to-session noise measured on the
-- H200 (gemmgen.measure.comparison), and the same pair timed in server mode. The spread
-- (p10-p90) of either time, which the rule used before, holds common clock drift the
-- interleaved comparison does not suffer from: 20 choices of the 109-shape sample recorded
-- 1.02-1.06x and replicated within 1 % in a later session, yet could not serve. A choice
-- serves if it beat torch.matmul offline beyond its noise and, where server mode was timed,
-- is not slower there beyond that mode's noise. Choices recorded before this version have
-- neither and keep the old rule.

ALTER TABLE library_choices ADD COLUMN noise REAL;
ALTER TABLE library_choices ADD COLUMN server_ms REAL;
ALTER TABLE library_choices ADD COLUMN torch_server_ms REAL;
ALTER TABLE library_choices ADD COLUMN server_noise REAL;

DROP VIEW library_winners;

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
) WHERE rank = 1 AND check_passed = 1 AND device_ms > 0 AND torch_ms > 0
    AND COALESCE(noise, spread) IS NOT NULL AND device_ms * (1.0 + COALESCE(noise, spread)) < torch_ms
    AND (server_ms IS NULL OR torch_server_ms IS NULL
         OR server_ms * (1.0 - COALESCE(server_noise, 0.0)) <= torch_server_ms);
