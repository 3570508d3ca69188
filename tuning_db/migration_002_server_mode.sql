-- Schema version 2: server-mode timing next to offline, and the problem family
-- (majors, dtypes, epilogue signature: the key without its shape) indexed for the
-- nearest-problem lookup.

ALTER TABLE trials ADD COLUMN server_ms REAL;          -- server-mode median device time
ALTER TABLE trials ADD COLUMN server_spread REAL;
ALTER TABLE trials ADD COLUMN best_baseline_server_ms REAL;

ALTER TABLE problems ADD COLUMN family TEXT NOT NULL DEFAULT '';
UPDATE problems SET family = substr(key, instr(key, ':') + 1);
CREATE INDEX problems_by_family ON problems (family);
