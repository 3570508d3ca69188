"""The SQL the database class runs, in one place (the schema lives in migration_*.sql)."""

INSERT_PROBLEM = """
INSERT OR IGNORE INTO problems
    (key, m, n, k, a_major, b_major, c_major, in_dtype, acc_dtype, epilogue, family)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"""

INSERT_DEVICE = """
INSERT OR IGNORE INTO devices (name, cc, sms, driver, cuda, libraries) VALUES (?, ?, ?, ?, ?, ?)"""

SELECT_DEVICE_ID = """
SELECT id FROM devices
WHERE name = ? AND cc = ? AND sms = ? AND driver = ? AND cuda = ? AND libraries = ?"""

INSERT_TRIAL = """
INSERT OR IGNORE INTO trials
    (problem_id, device_id, program, backend, status, build_ok, build_msg, build_s,
     check_passed, check_msg, max_rel_err, err_bound, check_seed, device_ms, spread,
     server_ms, server_spread, host_ms, best_baseline, best_baseline_ms,
     best_baseline_server_ms, baselines, proposer, proposer_version, created, noise,
     unverified, toolchain)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"""

_TRIAL_COLUMNS = """
SELECT t.*, p.key AS problem_key, d.name AS d_name, d.cc AS d_cc, d.sms AS d_sms,
       d.driver AS d_driver, d.cuda AS d_cuda, d.libraries AS d_libraries"""

SELECT_TRIALS = _TRIAL_COLUMNS + """
FROM trials t JOIN problems p ON p.id = t.problem_id JOIN devices d ON d.id = t.device_id"""

# current_trials (migrations 008, 009): neither merged (unverified) nor superseded, nor timed
# against a baseline since made faster.
SELECT_TRIED_PROGRAMS = """
SELECT DISTINCT t.program FROM current_trials t
JOIN problems p ON p.id = t.problem_id JOIN devices d ON d.id = t.device_id
WHERE p.key = ? AND d.name = ?"""

# The toolchain condition: the second argument is JSON {backend: this machine's toolchain string}.
_UNDER = """t.toolchain = json_extract(?, '$."' || t.backend || '"')"""

SELECT_TRIED_PROGRAMS_UNDER = SELECT_TRIED_PROGRAMS + " AND " + _UNDER

_WINNER_COLUMNS = """
SELECT w.*, w.problem_key AS problem_key, d.name AS d_name, d.cc AS d_cc, d.sms AS d_sms,
       d.driver AS d_driver, d.cuda AS d_cuda, d.libraries AS d_libraries
FROM winners w JOIN devices d ON d.id = w.device_id"""

SELECT_WINNERS = _WINNER_COLUMNS + " WHERE w.device_name = ? ORDER BY w.problem_key"

# The winners view's ranking, among the trials measured under the given driver and toolchain.
SELECT_WINNERS_UNDER = """
SELECT w.*, d.name AS d_name, d.cc AS d_cc, d.sms AS d_sms,
       d.driver AS d_driver, d.cuda AS d_cuda, d.libraries AS d_libraries
FROM (
    SELECT t.*, ROW_NUMBER() OVER (PARTITION BY t.problem_id ORDER BY t.speedup DESC, t.id) AS rank
    FROM winning_trials t WHERE t.device_name = ? AND """ + _UNDER + """
) w JOIN devices d ON d.id = w.device_id
WHERE w.rank = 1 ORDER BY w.problem_key"""

# Problems with at least one passing, measured trial on a GPU: tuned there, winner or not,
# with the least best-baseline time any of their runs measured.
SELECT_TUNED = """
SELECT p.key, min(t.best_baseline_ms) FROM current_trials t
JOIN problems p ON p.id = t.problem_id
JOIN devices d ON d.id = t.device_id
WHERE d.name = ? AND t.status = 'ok' AND t.check_passed = 1 AND t.best_baseline_ms > 0
GROUP BY p.key
"""

SELECT_WINNER = _WINNER_COLUMNS + " WHERE w.problem_key = ? AND w.device_name = ?"

INSERT_LIBRARY = """
INSERT OR IGNORE INTO library_choices
    (problem_id, device_id, library, version, config, algorithm, candidates, check_passed,
     max_rel_err, err_bound, check_seed, device_ms, spread, torch_ms, torch_spread, noise,
     server_ms, torch_server_ms, server_noise, created, unverified)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"""

_LIBRARY_COLUMNS = """
SELECT c.*, p.key AS problem_key, d.name AS d_name, d.cc AS d_cc, d.sms AS d_sms,
       d.driver AS d_driver, d.cuda AS d_cuda, d.libraries AS d_libraries"""

SELECT_LIBRARY = _LIBRARY_COLUMNS + """
FROM library_choices c JOIN problems p ON p.id = c.problem_id JOIN devices d ON d.id = c.device_id"""

# Problems whose library search ran on this kind of GPU against the current baselines (migration
# 009), whether or not its choice serves, each with torch.matmul's least time beside this
# database's own searches (NULL if none: a merged record's times are not trusted).
SELECT_LIBRARY_SEARCHED = """
SELECT p.key, min(CASE WHEN c.torch_ms > 0 AND c.unverified = 0 THEN c.torch_ms END) FROM library_choices c
JOIN problems p ON p.id = c.problem_id JOIN devices d ON d.id = c.device_id
WHERE d.name = ? AND (c.unverified = 1 OR c.id IN (SELECT id FROM current_library_choices))
GROUP BY p.key"""

SELECT_LIBRARY_WINNERS = _LIBRARY_COLUMNS + """
FROM library_winners c JOIN problems p ON p.id = c.problem_id JOIN devices d ON d.id = c.device_id
WHERE d.name = ? ORDER BY p.key"""

# Per problem and kind of GPU (all, or the one given twice): its trials, the winning program and
# the serving library choice if any, and whether anything of its own runs passed its check.
SELECT_TUNED_SUMMARY = """
WITH tuned AS (
    SELECT t.problem_id, d.name AS device_name FROM trials t JOIN devices d ON d.id = t.device_id
    UNION
    SELECT c.problem_id, d.name FROM library_choices c JOIN devices d ON d.id = c.device_id
)
SELECT p.key AS problem_key, u.device_name,
       (SELECT count(*) FROM trials t JOIN devices d ON d.id = t.device_id
        WHERE t.problem_id = u.problem_id AND d.name = u.device_name) AS trials,
       w.backend AS winner_backend, w.speedup,
       (SELECT max(l.speedup) FROM library_winners l
        WHERE l.problem_id = u.problem_id AND l.device_name = u.device_name) AS library_speedup,
       EXISTS (SELECT 1 FROM current_trials t JOIN devices d ON d.id = t.device_id
               WHERE t.problem_id = u.problem_id AND d.name = u.device_name AND t.status = 'ok'
                 AND t.check_passed = 1 AND t.best_baseline_ms > 0)
       OR EXISTS (SELECT 1 FROM current_library_choices c JOIN devices d ON d.id = c.device_id
                  WHERE c.problem_id = u.problem_id AND d.name = u.device_name
                    AND c.check_passed = 1) AS passed
FROM tuned u
JOIN problems p ON p.id = u.problem_id
LEFT JOIN winners w ON w.problem_id = u.problem_id AND w.device_name = u.device_name
WHERE ? IS NULL OR u.device_name = ?
ORDER BY p.m, p.n, p.k, p.key, u.device_name"""
