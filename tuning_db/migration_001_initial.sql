-- gemmgen tuning database, schema version 1: devices, problems, trials, winners.
-- Applied by gemmgen.tuning_db.database in one transaction; PRAGMA user_version
-- records the last migration applied.

CREATE TABLE devices (
    id        INTEGER PRIMARY KEY,
    name      TEXT NOT NULL,              -- torch.cuda.get_device_name(), e.g. 'NVIDIA H200'
    cc        TEXT NOT NULL DEFAULT '',   -- compute capability, e.g. '9.0'
    sms       INTEGER NOT NULL DEFAULT 0,
    driver    TEXT NOT NULL DEFAULT '',
    cuda      TEXT NOT NULL DEFAULT '',
    libraries TEXT NOT NULL DEFAULT '{}', -- JSON object, sorted keys: torch, triton, cutlass, ...
    UNIQUE (name, cc, sms, driver, cuda, libraries)
);

CREATE TABLE problems (
    id        INTEGER PRIMARY KEY,
    key       TEXT NOT NULL UNIQUE,       -- Problem.key: shape, majors, dtypes, epilogue signature
    m         INTEGER NOT NULL,
    n         INTEGER NOT NULL,
    k         INTEGER NOT NULL,
    a_major   TEXT NOT NULL,
    b_major   TEXT NOT NULL,
    c_major   TEXT NOT NULL,
    in_dtype  TEXT NOT NULL,
    acc_dtype TEXT NOT NULL,
    epilogue  TEXT NOT NULL               -- Epilogue.signature
);

CREATE TABLE trials (
    id               INTEGER PRIMARY KEY,
    problem_id       INTEGER NOT NULL REFERENCES problems(id),
    device_id        INTEGER NOT NULL REFERENCES devices(id),
    program          TEXT NOT NULL,       -- canonical DSL text
    backend          TEXT NOT NULL,
    status           TEXT NOT NULL,       -- ok | invalid | build_failed | check_failed | run_failed
    build_ok         INTEGER,             -- NULL: never built (invalid program)
    build_msg        TEXT NOT NULL DEFAULT '',
    build_s          REAL,
    check_passed     INTEGER,             -- NULL: never checked
    check_msg        TEXT NOT NULL DEFAULT '',
    max_rel_err      REAL,
    err_bound        REAL,
    check_seed       INTEGER,
    device_ms        REAL,                -- offline median device time per call
    spread           REAL,                -- relative spread of device_ms (fraction)
    host_ms          REAL,
    best_baseline    TEXT,                -- name of the fastest baseline of the same run
    best_baseline_ms REAL,                -- its offline median device time
    baselines        TEXT NOT NULL DEFAULT '{}', -- JSON {name: {device_ms, spread, ...}} of the same run
    proposer         TEXT NOT NULL DEFAULT '',
    proposer_version TEXT NOT NULL DEFAULT '',
    created          TEXT NOT NULL,       -- ISO 8601 UTC, microseconds
    UNIQUE (problem_id, device_id, program, created)
);

CREATE INDEX trials_by_problem ON trials (problem_id, device_id);

-- The never-slower rule, as a query: a trial may win only if it passed its check and
--     device_ms * (1 + spread) < best_baseline_ms
-- with both times from the same run. Among those, the largest speedup over that run's
-- best baseline wins (ties: the earlier trial), per problem and device name.
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
) WHERE rank = 1;
