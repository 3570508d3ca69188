-- Schema version 4: library choices. For one problem, the fastest algorithm a vendor library
-- offers (every algorithm of cuBLASLt's heuristic list timed), checked on random inputs, then
-- timed beside torch.matmul in one session (gemmgen.measure.library). gemmgen.compile serves
-- it for a problem no program won, if it beat torch.matmul by more than its own noise.

CREATE TABLE library_choices (
    id           INTEGER PRIMARY KEY,
    problem_id   INTEGER NOT NULL REFERENCES problems(id),
    device_id    INTEGER NOT NULL REFERENCES devices(id),
    library      TEXT NOT NULL,          -- 'cublaslt'
    version      TEXT NOT NULL,          -- the library version the algorithm is valid for
    config       TEXT NOT NULL,          -- JSON, sorted keys: algorithm id, tile, stages, ...
    algorithm    TEXT NOT NULL,          -- the library's serialised algorithm, hex
    candidates   INTEGER NOT NULL,       -- algorithms timed to choose it
    check_passed INTEGER NOT NULL,
    max_rel_err  REAL,
    err_bound    REAL,
    check_seed   INTEGER,
    device_ms    REAL,                   -- offline median device time per call
    spread       REAL,
    torch_ms     REAL,                   -- torch.matmul, same session, interleaved
    torch_spread REAL,
    created      TEXT NOT NULL,
    UNIQUE (problem_id, device_id, library, algorithm, created)
);

CREATE INDEX library_by_problem ON library_choices (problem_id, device_id);

-- The latest measurement per problem, GPU, library and version decides (not the best of
-- several: that would pick noise); it serves only if it passed its check and
--     device_ms * (1 + spread) < torch_ms.
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
    AND spread IS NOT NULL AND device_ms * (1.0 + spread) < torch_ms;
