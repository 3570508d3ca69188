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
     best_baseline_server_ms, baselines, proposer, proposer_version, created, noise)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"""

_TRIAL_COLUMNS = """
SELECT t.*, p.key AS problem_key, d.name AS d_name, d.cc AS d_cc, d.sms AS d_sms,
       d.driver AS d_driver, d.cuda AS d_cuda, d.libraries AS d_libraries"""

SELECT_TRIALS = _TRIAL_COLUMNS + """
FROM trials t JOIN problems p ON p.id = t.problem_id JOIN devices d ON d.id = t.device_id"""

SELECT_TRIED_PROGRAMS = """
SELECT DISTINCT t.program FROM trials t
JOIN problems p ON p.id = t.problem_id JOIN devices d ON d.id = t.device_id
WHERE p.key = ? AND d.name = ? AND t.status != 'superseded'"""

_WINNER_COLUMNS = """
SELECT w.*, w.problem_key AS problem_key, d.name AS d_name, d.cc AS d_cc, d.sms AS d_sms,
       d.driver AS d_driver, d.cuda AS d_cuda, d.libraries AS d_libraries
FROM winners w JOIN devices d ON d.id = w.device_id"""

SELECT_WINNERS = _WINNER_COLUMNS + " WHERE w.device_name = ? ORDER BY w.problem_key"

# Problems with at least one passing, measured trial on a GPU: tuned there, winner or not,
# with the least best-baseline time any of their runs measured.
SELECT_TUNED = """
SELECT p.key, min(t.best_baseline_ms) FROM trials t
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
     server_ms, torch_server_ms, server_noise, created)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"""

_LIBRARY_COLUMNS = """
SELECT c.*, p.key AS problem_key, d.name AS d_name, d.cc AS d_cc, d.sms AS d_sms,
       d.driver AS d_driver, d.cuda AS d_cuda, d.libraries AS d_libraries"""

SELECT_LIBRARY = _LIBRARY_COLUMNS + """
FROM library_choices c JOIN problems p ON p.id = c.problem_id JOIN devices d ON d.id = c.device_id"""

SELECT_LIBRARY_WINNERS = _LIBRARY_COLUMNS + """
FROM library_winners c JOIN problems p ON p.id = c.problem_id JOIN devices d ON d.id = c.device_id
WHERE d.name = ? ORDER BY p.key"""
