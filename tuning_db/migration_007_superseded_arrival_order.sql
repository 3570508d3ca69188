-- Schema version 7: trials of a kernel gemmgen no longer builds are `superseded`: kept for the
-- record, never a winner, and measured again by the next tuning run (resume skips only the
-- other statuses). The first: Triton split-K programs that add partials in arrival order
-- (`unordered`, `atomic`), recorded before 2026-11-30T01:00Z. Their finalize kernel read the
-- fp32 buffer with a plain load and could return sums the atomics had not yet added in (on
-- the H200, 1024x2048x12288 split 2 lost up to 0.6 % of its outputs in 12 of 12 calls, and a
-- 4096x256x2048 program that had passed its check lost some in 1 of 12). It now takes each
-- sum with an atomic exchange, which also made it slower (64x64x12288: 5.98 us -> 6.75 us),
-- so neither their checks nor their times describe what is built now.

UPDATE trials SET status = 'superseded'
WHERE backend = 'triton' AND status = 'ok' AND created < '2026-11-30T01:00:00'
  AND (program LIKE '%split_k % unordered%' OR program LIKE '%split_k % atomic%');
