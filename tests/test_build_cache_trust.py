"""The build cache holds data, never code to run: nothing in it is unpickled, every binary is
checked against its recorded hash, builds of one key do not race, and a failed build is
retried once in a later run before it counts as failed for good."""
from __future__ import annotations

import ast
import json
import multiprocessing as mp
import os
import pickle
import time
from pathlib import Path

import pytest

from gemmgen.backends import build as builds
from gemmgen.backends.base import Artifact, BackendError, Source
from gemmgen.cache import CACHE_ENV


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


class _Planted:
    """Unpickling this creates `marker` (a stand-in for os.system)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def _source(text: str = "kernel text") -> Source:
    # Tuples, nested dicts and ints in meta: the digest must survive the JSON round trip.
    return Source(backend="triton", text=text, entry="k",
                  meta={"kernels": ({"params": (("a", "*fp16", "a"),), "hints": {"a": 16}},), "shape": None})


def _compile(key: str, work: Path) -> Artifact:
    (work / "kernel.cubin").write_bytes(b"\x7fELF-cubin")
    return Artifact(backend="triton", key=key, path=str(work / "kernel.cubin"), data=b"\x7fELF-data",
                    meta={"kernels": ({"name": "k", "cubin": b"\x00cubin-bytes", "metadata": {"shared": 0}},),
                          "source": _source(), "entries": ("k",)})


def _plant_everywhere(backend: str, key: str, marker: Path) -> None:
    """A malicious pickle where the old cache kept artifacts, and as the new metadata file."""
    payload = pickle.dumps(_Planted(marker))
    bucket = builds.entry_dir(backend, key).parent
    bucket.mkdir(parents=True, exist_ok=True)
    (bucket / f"{key}.pkl").write_bytes(payload)
    builds.entry_dir(backend, key).mkdir(exist_ok=True)
    builds.artifact_path(backend, key).write_bytes(payload)


def test_build_module_does_not_import_pickle():
    tree = ast.parse(Path(builds.__file__).read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not imported & {"pickle", "cPickle", "dill", "marshal", "shelve"}


def test_planted_pickle_is_never_loaded_and_the_build_succeeds(tmp_path):
    src = _source()
    key = builds.artifact_key(src, "sm_90a", "tool", ())
    marker = tmp_path / "pwned"
    _plant_everywhere("triton", key, marker)
    with pytest.warns(builds.CacheWarning):
        built = builds.cached_build(src, "sm_90a", "tool", (), _compile)
    assert not marker.exists()
    assert built.data == b"\x7fELF-data" and built.meta["kernels"][0]["cubin"] == b"\x00cubin-bytes"
    assert json.loads(builds.artifact_path("triton", key).read_text())["key"] == key


def test_planted_pickle_in_a_blob_is_never_loaded(tmp_path):
    src = _source()
    built = builds.cached_build(src, "sm_90a", "tool", (), _compile)
    marker = tmp_path / "pwned"
    for blob in builds.entry_dir("triton", built.key).glob("blob-*.bin"):
        blob.write_bytes(pickle.dumps(_Planted(marker)))
    with pytest.warns(builds.CacheWarning, match="SHA-256"):
        again = builds.cached_build(src, "sm_90a", "tool", (), _compile)
    assert not marker.exists()
    assert again == built


def test_planted_pickle_during_a_real_triton_build(tmp_path):
    pytest.importorskip("triton")
    from gemmgen import backends, dsl
    from gemmgen.backends.triton import compiler

    program = dsl.parse(dsl.examples()["triton_split_k"].read_text())
    source = backends.get("triton").lower(program)
    key = builds.artifact_key(source, "sm_90a", compiler.toolchain(), ())
    marker = tmp_path / "pwned"
    _plant_everywhere("triton", key, marker)
    with pytest.warns(builds.CacheWarning):
        artifact = compiler.build(source)
    assert not marker.exists()
    assert artifact.meta["kernels"][0]["cubin"][:4] == b"\x7fELF"
    # The source read back from JSON is the one built (same digest: the unhinted build keys on it).
    again = compiler.build(source)
    assert again == artifact and again.meta["source"].digest == source.digest


def test_cached_artifact_round_trips_exactly():
    src = _source()
    fresh = builds.cached_build(src, "sm_90a", "tool", (), _compile)
    hit = builds.lookup("triton", fresh.key, src.digest)
    assert hit == fresh
    assert isinstance(hit.meta["kernels"], tuple) and isinstance(hit.meta["entries"], tuple)
    assert hit.meta["source"] == src and hit.meta["source"].digest == src.digest


@pytest.mark.parametrize("target", ["blob", "path file"])
def test_tampered_binary_is_detected_and_rebuilt(target):
    src = _source()
    calls = []

    def compile_fn(key, work):
        calls.append(key)
        return _compile(key, work)

    built = builds.cached_build(src, "sm_90a", "tool", (), compile_fn)
    folder = builds.entry_dir("triton", built.key)
    victim = next(folder.glob("blob-*.bin")) if target == "blob" else folder / "kernel.cubin"
    victim.write_bytes(victim.read_bytes()[:-1] + b"!")
    with pytest.warns(builds.CacheWarning, match="does not match its recorded SHA-256"):
        assert builds.lookup("triton", built.key) is None
    with pytest.warns(builds.CacheWarning):
        again = builds.cached_build(src, "sm_90a", "tool", (), compile_fn)
    assert len(calls) == 2
    assert again == built and Path(again.path).read_bytes() == b"\x7fELF-cubin"


def test_entry_from_another_source_or_outside_path_is_refused(cache_dir):
    src = _source()
    built = builds.cached_build(src, "sm_90a", "tool", (), _compile)
    doc_path = builds.artifact_path("triton", built.key)
    doc = json.loads(doc_path.read_text())
    with pytest.warns(builds.CacheWarning, match="another source"):
        assert builds.lookup("triton", built.key, _source("other").digest) is None
    doc["path"], doc["path_sha256"] = "../../../../outside.so", None
    doc_path.write_text(json.dumps(doc))
    with pytest.warns(builds.CacheWarning, match="leaves the entry"):
        assert builds.lookup("triton", built.key) is None


def test_build_may_not_return_a_path_outside_its_folder(tmp_path):
    outside = tmp_path / "elsewhere.so"
    outside.write_bytes(b"x")
    with pytest.raises(builds.BuildFailed, match="outside the folder"):
        builds.cached_build(_source(), "sm_90a", "tool", (), lambda k, w: Artifact("triton", k, path=str(outside)))


def _concurrent_builder(cache: str, log: str, start: float, queue) -> None:
    os.environ[CACHE_ENV] = cache

    def compile_fn(key, work):
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        (work / "kernel.cubin").write_bytes(b"\x7fELF" + b"x" * 100_000)
        time.sleep(0.5)   # wide enough for every other builder to arrive meanwhile
        return Artifact(backend="triton", key=key, path=str(work / "kernel.cubin"), data=b"cubin", meta={"n": 1})

    time.sleep(max(0.0, start - time.time()))
    try:
        art = builds.cached_build(_source(), "sm_90a", "tool", (), compile_fn)
        queue.put(("ok", art.key, art.path, art.data))
    except Exception as exc:  # noqa: BLE001
        queue.put(("error", repr(exc), None, None))


def test_concurrent_builders_of_one_key_make_one_valid_artifact(cache_dir, tmp_path):
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    log = tmp_path / "compiles.log"
    start = time.time() + 0.5
    procs = [ctx.Process(target=_concurrent_builder, args=(str(cache_dir), str(log), start, queue))
             for _ in range(3)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert all(r[0] == "ok" for r in results), results
    assert len(set(results)) == 1
    assert len(log.read_text().split()) == 1          # compiled once; the others waited and read it
    key, path = results[0][1], results[0][2]
    assert builds.lookup("triton", key, _source().digest).path == path
    assert not list(builds.entry_dir("triton", key).parent.glob(".tmp-*"))


def _failing(calls: list, fail: bool = True):
    def compile_fn(key, work):
        calls.append(key)
        (work / "nvcc.log").write_text("error: something transient")
        if fail:
            raise BackendError(f"nvcc could not compile (full log: {work / 'nvcc.log'})")
        return Artifact("triton", key, data=b"ok")
    return compile_fn


def test_failed_build_is_retried_once_in_a_later_run_then_counted(monkeypatch):
    src = _source()
    calls: list = []
    monkeypatch.setattr(builds, "_run_id", "run-1")
    with pytest.raises(builds.BuildFailed) as first:
        builds.cached_build(src, "sm_90a", "tool", (), _failing(calls))
    assert not first.value.final and len(calls) == 1
    key = calls[0]
    failed = builds.failed_dir("triton", key)
    # The message names where the attempt's files are kept, not the temporary folder.
    assert str(failed / "nvcc.log") in str(first.value) and (failed / "nvcc.log").exists()
    assert builds.read_failure("triton", key)["attempts"] == 1

    with pytest.raises(builds.BuildFailed, match="earlier in this run") as same_run:
        builds.cached_build(src, "sm_90a", "tool", (), _failing(calls))
    assert not same_run.value.final and len(calls) == 1

    monkeypatch.setattr(builds, "_run_id", "run-2")
    with pytest.raises(builds.BuildFailed) as second:
        builds.cached_build(src, "sm_90a", "tool", (), _failing(calls))
    assert second.value.final and len(calls) == 2
    assert "failed in 2 runs" in str(second.value) and str(failed) in str(second.value)

    monkeypatch.setattr(builds, "_run_id", "run-3")
    with pytest.raises(builds.BuildFailed) as third:
        builds.cached_build(src, "sm_90a", "tool", (), _failing(calls, fail=False))
    assert third.value.final and len(calls) == 2       # final: not compiled again

    # Deleting the failure folder, as the message says, builds it again.
    import shutil
    shutil.rmtree(failed)
    assert builds.cached_build(src, "sm_90a", "tool", (), _failing(calls, fail=False)).data == b"ok"
    assert len(calls) == 3


def test_transient_failure_then_success_clears_the_record(monkeypatch):
    src = _source()
    calls: list = []
    monkeypatch.setattr(builds, "_run_id", "run-1")
    with pytest.raises(builds.BuildFailed):
        builds.cached_build(src, "sm_90a", "tool", (), _failing(calls))
    monkeypatch.setattr(builds, "_run_id", "run-2")
    built = builds.cached_build(src, "sm_90a", "tool", (), _failing(calls, fail=False))
    assert built.data == b"ok" and len(calls) == 2
    assert builds.read_failure("triton", built.key) is None
    assert not builds.failed_dir("triton", built.key).exists()


def test_build_failure_pickles_with_its_finality():
    err = pickle.loads(pickle.dumps(builds.BuildFailed("x failed", final=True)))
    assert isinstance(err, BackendError) and err.final and str(err) == "x failed"


def test_a_moved_cache_finds_its_cutlass_library_only_if_it_checks_out():
    from gemmgen.backends import cutlass

    src = Source(backend="cutlass", text="// instance", entry="gg_run")

    def compile_fn(key, work):
        (work / "instance.so").write_bytes(b"\x7fELF-library")
        return Artifact("cutlass", key, path=str(work / "instance.so"), meta={"spec": {}})

    built = builds.cached_build(src, "sm_90a", "nvcc-x", (), compile_fn)
    moved = Artifact("cutlass", built.key, path="/elsewhere/instance.so")
    assert cutlass.library_path(moved) == built.path == str(builds.entry_dir("cutlass", built.key) / "instance.so")
    # A library changed after it was built is never handed to dlopen.
    Path(built.path).write_bytes(b"\x7fELF-planted")
    with pytest.warns(builds.CacheWarning), pytest.raises(BackendError, match="rebuild"):
        cutlass.library_path(moved)
    with pytest.raises(BackendError, match="rebuild"):
        cutlass.library_path(Artifact("cutlass", "not-a-key", path="/elsewhere/instance.so"))
