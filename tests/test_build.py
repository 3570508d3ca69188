"""The shared build machinery: the disk cache and the parallel pool (no compiler needed)."""
from __future__ import annotations

import json

import pytest

from gemmgen.backends import build as builds
from gemmgen.backends.base import Artifact, BackendError, Source
from gemmgen.cache import CACHE_ENV


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def _source(text: str = "kernel text", backend: str = "triton") -> Source:
    return Source(backend=backend, text=text, entry="k", meta={"x": 1})


def test_cached_build_compiles_once_then_hits(cache_dir):
    calls = []

    def compile_fn(key, work):
        calls.append((key, work))
        (work / "out.bin").write_bytes(b"\x00cubin")
        return Artifact(backend="triton", key=key, path=str(work), data=b"\x00cubin")

    first = builds.cached_build(_source(), "sm_90a", "tool-1", ("-O3",), compile_fn)
    second = builds.cached_build(_source(), "sm_90a", "tool-1", ("-O3",), compile_fn)
    assert len(calls) == 1
    assert first == second
    assert builds.artifact_path("triton", first.key).is_relative_to(cache_dir)
    # The compiler wrote into a temporary folder that was renamed into place whole.
    assert not calls[0][1].exists()
    assert first.path == str(builds.entry_dir("triton", first.key))
    assert (builds.entry_dir("triton", first.key) / "out.bin").read_bytes() == b"\x00cubin"


@pytest.mark.parametrize("change", ["text", "arch", "toolchain", "flags"])
def test_key_changes_with_each_input(change):
    base = dict(source=_source(), arch="sm_90a", toolchain="tool-1", flags=("-O3",))
    key = "source" if change == "text" else change
    changed = dict(base)
    changed[key] = {"text": _source("other text"), "arch": "sm_80", "toolchain": "tool-2",
                       "flags": ("-O2",)}[change]
    assert builds.artifact_key(**base) != builds.artifact_key(**changed)


def test_corrupt_cache_entry_is_a_miss(cache_dir):
    src = _source()
    key = builds.artifact_key(src, "sm_90a", "t", ())
    path = builds.artifact_path("triton", key)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not json")
    with pytest.warns(builds.CacheWarning, match="failed its check"):
        assert builds.lookup("triton", key) is None
    with pytest.warns(builds.CacheWarning):
        made = builds.cached_build(src, "sm_90a", "t", (), lambda k, w: Artifact("triton", k, data=b"x"))
    assert json.loads(path.read_text())["key"] == key
    assert builds.lookup("triton", key, src.digest) == made


def test_compile_fn_must_return_its_key():
    with pytest.raises(BackendError, match="keyed"):
        builds.cached_build(_source(), "sm_90a", "t", (), lambda k, w: Artifact("triton", "wrong"))


def test_build_many_returns_errors_as_values():
    results = builds.build_many([_source(backend="nonesuch"), _source("b", backend="nonesuch")], jobs=1)
    assert len(results) == 2
    assert all(isinstance(r, BackendError) for r in results)
    assert "unknown backend" in str(results[0])


def test_build_many_builds_duplicates_once(monkeypatch):
    seen = []

    def fake_build_one(source, arch="sm_90a"):
        seen.append(source.digest)
        return Artifact(source.backend, source.digest)

    monkeypatch.setattr(builds, "build_one", fake_build_one)
    progress = []
    srcs = [_source("a"), _source("b"), _source("a")]
    results = builds.build_many(srcs, jobs=1, progress=lambda i, r: progress.append(i))
    assert [r.key for r in results] == [s.digest for s in srcs]
    assert len(seen) == 2
    assert sorted(progress) == [0, 1, 2]
    ok, failed = builds.partition(results + [BackendError("x")])
    assert len(ok) == 3 and len(failed) == 1


def test_build_command_builds_program_files_and_reports_rate(capsys):
    pytest.importorskip("triton")
    from gemmgen import dsl
    from gemmgen.cli import main

    example = str(dsl.examples()["triton_split_k"])
    assert main(["build", "--backend", "triton", "--programs", example, "-j", "1", "--no-progress"]) == 0
    first = capsys.readouterr().out
    assert "1 built, 0 failed" in first and "builds/minute" in first
    assert main(["build", "--backend", "triton", "--programs", example, "-j", "1", "--no-progress"]) == 0


def test_build_command_refuses_missing_inputs(capsys):
    from gemmgen.cli import main

    assert main(["build", "--backend", "triton", "--programs", "/nonexistent.gemm"]) == 2
    assert "no such program file" in capsys.readouterr().err
    assert main(["build", "--backend", "triton", "--space", "triton"]) == 2
