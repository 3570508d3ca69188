"""Several writers at once, and a writer killed inside a transaction."""
import os
import signal
import subprocess
import sys
import textwrap
import time

from gemmgen.dsl.ir import Problem
from gemmgen.tuning_db import Database

WRITER = textwrap.dedent("""
    import sys
    from gemmgen.dsl.ir import Problem
    from gemmgen.tuning_db import Database
    sys.path.insert(0, sys.argv[3])
    from tuning_fakes import trial
    import os, time
    db = Database(sys.argv[1])
    while not os.path.exists(sys.argv[1] + ".go"):   # start together: the writes contend
        time.sleep(0.005)
    for i in range(150):
        db.record(trial(Problem(128 * (1 + i % 4), 256, 512), program=f"{sys.argv[2]} {i}\\n"))
""")

HOLDER = textwrap.dedent("""
    import sys, time
    from gemmgen.dsl.ir import Problem
    from gemmgen.tuning_db import Database
    sys.path.insert(0, sys.argv[2])
    from tuning_fakes import trial
    db = Database(sys.argv[1])
    db.record(trial(Problem(64, 64, 64), program="committed\\n"))
    db.conn.execute("BEGIN IMMEDIATE")
    for i in range(50):
        db.conn.execute("INSERT INTO devices (name) VALUES (?)", (f"half-written {i}",))
    print("inside", flush=True)
    time.sleep(60)
""")

HERE = os.path.dirname(__file__)


def test_two_processes_write_at_once(tmp_path):
    path = str(tmp_path / "shared.sqlite")
    Database(path).close()
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, path, name, HERE]) for name in ("w1", "w2")]
    time.sleep(1.0)
    open(path + ".go", "w").close()
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    with Database(path) as db:
        programs = [t.program for t in db.trials()]
        assert len(programs) == 300
        assert {p.split()[0] for p in programs} == {"w1", "w2"}
        assert db.stats()["problems"] == 4
        assert db.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_writer_killed_mid_transaction(tmp_path):
    path = str(tmp_path / "t.sqlite")
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, path, HERE], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "inside"
        start = time.monotonic()
        with Database(path) as reader:  # a lookup opens and reads while a writer holds the lock
            assert [t.program for t in reader.trials()] == ["committed\n"]
        assert time.monotonic() - start < 5
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    start = time.monotonic()
    with Database(path) as db:   # opens although the dead writer held the write lock
        assert [t.program for t in db.trials()] == ["committed\n"]
        assert db.conn.execute("SELECT count(*) FROM devices WHERE name LIKE 'half-written%'").fetchone()[0] == 0
        assert db.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        from tuning_fakes import trial
        db.record(trial(Problem(64, 64, 64), program="after\n"))
        assert len(list(db.trials())) == 2
    assert time.monotonic() - start < 10
