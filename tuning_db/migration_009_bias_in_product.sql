-- Schema version 9: the baselines add nn.Linear's bias inside the product, as every model runs
-- it (`Problem.linear_bias`: a bias over N, no C, operands of the output's dtype): torch through
-- `torch.addmm(bias, a, b)`, cuBLASLt (baselines and recorded choices) through its BIAS
-- epilogue. Until 2026-12-05T16:40Z they added it after the product, a second pass over M x N
-- that no model pays, so the records of such problems made before then were timed against
-- baselines slower than what they replace, and a cuBLASLt choice's algorithm was planned for
-- another form of the product. Those trials and library choices neither serve nor count as
-- measured baselines, and the next tuning run measures them again. As in migration 008,
-- conditions in the views, not rewritten rows; records.BIAS_IN_PRODUCT_SINCE is the same instant.

-- The problems whose bias the baselines now add inside the product.
CREATE VIEW linear_bias_problems AS
SELECT id FROM problems
WHERE instr(epilogue, 'bias_n') > 0 AND instr(epilogue, 'beta') = 0
  AND substr(epilogue, -length(in_dtype) - 1) = '+' || in_dtype;     -- out dtype, last in the signature

DROP VIEW current_trials;
CREATE VIEW current_trials AS
SELECT * FROM trials
WHERE unverified = 0 AND status != 'superseded'
  AND NOT (backend = 'triton' AND created < '2026-11-30T01:00:00'
           AND (program LIKE '%split_k % unordered%' OR program LIKE '%split_k % atomic%'))
  AND NOT (created < '2026-12-05T16:40:00'
           AND problem_id IN (SELECT id FROM linear_bias_problems));

-- Library choices that may serve or give a baseline time: measured by this database's own runs
-- (not merged), against the current baselines.
CREATE VIEW current_library_choices AS
SELECT * FROM library_choices
WHERE unverified = 0
  AND NOT (created < '2026-12-05T16:40:00'
           AND problem_id IN (SELECT id FROM linear_bias_problems));

DROP VIEW library_winners;
CREATE VIEW library_winners AS
SELECT * FROM (
    SELECT c.*, p.key AS problem_key, d.name AS device_name,
           c.torch_ms / c.device_ms AS speedup,
           ROW_NUMBER() OVER (
               PARTITION BY c.problem_id, d.name, c.library, c.version
               ORDER BY c.created DESC, c.id DESC
           ) AS rank
    FROM current_library_choices c
    JOIN problems p ON p.id = c.problem_id
    JOIN devices d ON d.id = c.device_id
) WHERE rank = 1 AND check_passed = 1 AND device_ms > 0 AND torch_ms > 0
    AND COALESCE(noise, spread) IS NOT NULL AND device_ms * (1.0 + COALESCE(noise, spread)) < torch_ms
    AND (server_ms IS NULL OR torch_server_ms IS NULL
         OR server_ms * (1.0 - COALESCE(server_noise, 0.0)) <= torch_server_ms);
