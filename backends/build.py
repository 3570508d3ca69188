"""Shared build machinery: the disk cache of artifacts and the parallel build pool.

Every backend builds through `cached_build`, so a program compiled once (by a
test, a benchmark, or the tuning loop) is never compiled again for the same
source, toolchain and flags. `build_many` fans sources out over worker
processes: compilers hold the GIL and some are not thread-safe, and a crashed
compile then costs one result, not the run.

The cache stores data, never code to run: an artifact is JSON plus its binaries,
each binary checked against the SHA-256 the JSON records before it is handed out
(a file that fails the check is a miss that rebuilds, with a `CacheWarning`).
Nothing in the cache is unpickled. Layout under the cache root (env
GEMMGEN_CACHE_DIR, default ~/.cache/gemmgen), in artifacts/<backend>/<key[:2]>/:

    <key>/artifact.json       the Artifact: its fields as JSON, every binary's SHA-256
    <key>/blob-<sha>.bin      bytes the Artifact carries (cubins), named by their hash
    <key>/...                 the compiler's files (sources, PTX, cubin, library, log)
    <key>.lock                held (flock) while <key> is built: one builder per key
    .tmp-<key>-*/             a build in progress; renamed to <key>/ once whole
    <key>.failed/failure.json a failed build: how often and in which runs it failed,
                              beside that attempt's files. It is retried once in a
                              later run; after a second failure it fails at once
                              (`BuildFailed.final`) until the folder is deleted.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import math
import multiprocessing as mp
import os
import re
import shutil
import tempfile
import time
import uuid
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence, Union

from gemmgen.backends.base import Artifact, BackendError, Source

from gemmgen import backends
from gemmgen.cache import cache_root as shared_cache_root
from gemmgen.errors import GemmgenError

# Bump when what a build leaves under a key changes (it is part of every key).
CACHE_FORMAT = "1"
# The layout of artifact.json and failure.json; another value is a miss.
METADATA_FORMAT = 2
# A build is tried in at most this many runs before its failure is final.
BUILD_ATTEMPTS = 2
# Passed to build workers, so that one run's processes count as one run.
RUN_ENV = "GEMMGEN_BUILD_RUN"
_TAG = "$type"
_SHA256 = re.compile(r"[0-9a-f]{64}")


class CacheWarning(UserWarning):
    """A cache entry failed its check (changed, truncated or foreign) and is rebuilt."""


class BuildFailed(BackendError):
    """A build that failed. `final` once it has failed in BUILD_ATTEMPTS runs: it is then
    not compiled again (and not worth measuring again) until its `.failed` folder is deleted."""

    def __init__(self, message: str, final: bool = False):
        super().__init__(message)
        self.final = final


class _Corrupt(Exception):
    """Why a cache entry cannot be trusted (internal: becomes a CacheWarning and a miss)."""


_run_id = os.environ.get(RUN_ENV) or uuid.uuid4().hex


def run_id() -> str:
    """This run's identity: a failed build is retried once, in a run with another identity."""
    return _run_id


def _adopt_run(run: str) -> None:
    """Build workers take their parent's run identity (a pool initializer)."""
    global _run_id
    _run_id = run


def cache_root() -> Path:
    """The cache directory (`gemmgen.cache`), created on first use."""
    root = shared_cache_root()
    root.mkdir(parents=True, exist_ok=True)
    return root


def artifact_key(source: Source, arch: str, toolchain: str, flags: Sequence[str] = ()) -> str:
    """What makes two builds interchangeable: the source, the target, the compiler and its flags."""
    h = hashlib.sha256()
    for part in (CACHE_FORMAT, source.backend, source.digest, arch, toolchain, *flags):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def _bucket(backend: str, key: str) -> Path:
    if not re.fullmatch(r"[0-9a-f]{32}", key) or not re.fullmatch(r"[A-Za-z0-9_]+", backend):
        raise BackendError(f"not a build cache key: {backend}/{key}")
    return cache_root() / "artifacts" / backend / key[:2]


def entry_dir(backend: str, key: str) -> Path:
    """The folder of one build: its artifact.json, blobs and the compiler's files."""
    return _bucket(backend, key) / key


def artifact_path(backend: str, key: str) -> Path:
    return entry_dir(backend, key) / "artifact.json"


def failed_dir(backend: str, key: str) -> Path:
    """The last failed attempt's files and its failure.json (delete it to build the key again)."""
    return _bucket(backend, key) / f"{key}.failed"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---- the Artifact as JSON: plain values, tagged tuples/bytes/sources, binaries beside it -----

def _encode(value: Any, blobs: dict[str, bytes]) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            return {_TAG: "float", "repr": repr(value)}
        return value
    if isinstance(value, (bytes, bytearray)):
        sha = _sha256(bytes(value))
        blobs[sha] = bytes(value)
        return {_TAG: "bytes", "sha256": sha}
    if isinstance(value, tuple):
        return {_TAG: "tuple", "items": [_encode(v, blobs) for v in value]}
    if isinstance(value, list):
        return [_encode(v, blobs) for v in value]
    if isinstance(value, Source):
        return {_TAG: "source", "backend": value.backend, "text": value.text, "entry": value.entry,
                "meta": _encode(dict(value.meta), blobs)}
    if isinstance(value, Mapping):
        if all(isinstance(k, str) for k in value) and _TAG not in value:
            return {k: _encode(v, blobs) for k, v in value.items()}
        return {_TAG: "dict", "items": [[_encode(k, blobs), _encode(v, blobs)] for k, v in value.items()]}
    raise BackendError(f"a built artifact holds a {type(value).__name__}, which the build cache does not store: "
                       "give the backend's artifact plain data (numbers, strings, lists, dicts, bytes)")


def _decode(value: Any, folder: Path) -> Any:
    if isinstance(value, list):
        return [_decode(v, folder) for v in value]
    if not isinstance(value, dict):
        return value
    tag = value.get(_TAG)
    if tag is None:
        return {k: _decode(v, folder) for k, v in value.items()}
    if tag == "tuple":
        return tuple(_decode(v, folder) for v in value["items"])
    if tag == "dict":
        return {_decode(k, folder): _decode(v, folder) for k, v in value["items"]}
    if tag == "float":
        return float(value["repr"])
    if tag == "bytes":
        return _read_blob(folder, value["sha256"])
    if tag == "source":
        return Source(backend=value["backend"], text=value["text"], entry=value["entry"],
                      meta=_decode(value["meta"], folder))
    raise _Corrupt(f"unknown value type {tag!r}")


def _blob_name(sha: str) -> str:
    if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
        raise _Corrupt(f"not a SHA-256: {sha!r}")
    return f"blob-{sha}.bin"


def _read_blob(folder: Path, sha: str) -> bytes:
    data = (folder / _blob_name(sha)).read_bytes()
    if _sha256(data) != sha:
        raise _Corrupt(f"{_blob_name(sha)} does not match its recorded SHA-256")
    return data


def _inside(folder: Path, relative: str) -> Path:
    """`relative` under `folder`, refusing absolute paths and `..` (an entry names only its own files)."""
    rel = Path(relative)
    if rel.is_absolute() or ".." in rel.parts:
        raise _Corrupt(f"path {relative!r} leaves the entry")
    return folder / rel


def _write_entry(artifact: Artifact, folder: Path, source_digest: str) -> None:
    """artifact.json and the blobs into `folder` (the build's temporary folder)."""
    relative = None
    path_sha = None
    if artifact.path is not None:
        try:
            relative = Path(artifact.path).resolve().relative_to(folder.resolve()).as_posix()
        except ValueError:
            raise BackendError(f"a {artifact.backend} build returned the path {artifact.path}, outside the folder it "
                               f"was given ({folder}): a build writes only there") from None
        target = folder / relative
        if target.is_file():
            path_sha = _file_sha256(target)
    blobs: dict[str, bytes] = {}
    doc = {"format": METADATA_FORMAT, "backend": artifact.backend, "key": artifact.key, "source": source_digest,
           "path": relative, "path_sha256": path_sha, "data": _encode(artifact.data, blobs),
           "meta": _encode(dict(artifact.meta), blobs)}
    for sha, data in blobs.items():
        (folder / _blob_name(sha)).write_bytes(data)
    (folder / "artifact.json").write_text(json.dumps(doc))


def _read_entry(backend: str, key: str, source_digest: Optional[str]) -> Artifact:
    folder = entry_dir(backend, key)
    doc = json.loads((folder / "artifact.json").read_text())
    if not isinstance(doc, dict) or doc.get("format") != METADATA_FORMAT:
        raise _Corrupt("not a gemmgen artifact.json of this version")
    if doc.get("backend") != backend or doc.get("key") != key:
        raise _Corrupt(f"it records {doc.get('backend')}/{doc.get('key')}")
    if source_digest is not None and doc.get("source") != source_digest:
        raise _Corrupt("it was built from another source")
    path = None
    if doc.get("path") is not None:
        target = _inside(folder, doc["path"])
        if doc.get("path_sha256") is not None:
            if _file_sha256(target) != doc["path_sha256"]:
                raise _Corrupt(f"{doc['path']} does not match its recorded SHA-256")
        elif not target.is_dir():
            raise _Corrupt(f"{doc['path']} is missing")
        path = str(target)
    meta = _decode(doc.get("meta") or {}, folder)
    if not isinstance(meta, dict):
        raise _Corrupt("its meta is not a mapping")
    built_from = meta.get("source")
    if isinstance(built_from, Source) and source_digest is not None and built_from.digest != source_digest:
        raise _Corrupt("the source it records is not the one it was built from")
    data = _decode(doc.get("data"), folder)
    if data is not None and not isinstance(data, bytes):
        raise _Corrupt("its data is not bytes")
    return Artifact(backend=backend, key=key, path=path, data=data, meta=meta)


def lookup(backend: str, key: str, source_digest: Optional[str] = None) -> Optional[Artifact]:
    """The cached artifact, every binary checked against its hash; None for a miss. An entry that
    fails a check (changed, truncated, foreign) is a miss too, with a CacheWarning."""
    try:
        if not artifact_path(backend, key).exists():
            return None
    except BackendError:   # not a key this cache makes (an artifact from elsewhere)
        return None
    try:
        return _read_entry(backend, key, source_digest)
    except (_Corrupt, OSError, ValueError, KeyError, TypeError) as exc:
        warnings.warn(f"the cached {backend} build {entry_dir(backend, key)} failed its check "
                      f"({type(exc).__name__}: {exc}); it is rebuilt", CacheWarning, stacklevel=2)
        return None


# ---- building one key: a lock, a temporary folder renamed into place, failures recorded ------

@contextmanager
def _key_lock(backend: str, key: str) -> Iterator[None]:
    """One builder per key across processes: an exclusive flock on <key>.lock (freed if the holder dies)."""
    bucket = _bucket(backend, key)
    bucket.mkdir(parents=True, exist_ok=True)
    with open(bucket / f"{key}.lock", "ab") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _discard(path: Path) -> None:
    """Remove a folder whole: renamed aside first, so no reader sees it half-deleted."""
    if not path.exists():
        return
    aside = path.with_name(f".stale-{path.name}-{uuid.uuid4().hex[:8]}")
    os.rename(path, aside)
    shutil.rmtree(aside, ignore_errors=True)


def _install(tmp: Path, final: Path) -> None:
    """Rename the finished build into place (the lock is held: no one else writes `final`)."""
    _discard(final)
    os.rename(tmp, final)


def read_failure(backend: str, key: str) -> Optional[dict]:
    """The key's failure record: {"attempts", "runs", "message", ...}; None if it has none."""
    path = failed_dir(backend, key) / "failure.json"
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"attempts": 0, "runs": [], "message": "an unreadable failure record"}
    if not isinstance(record, dict) or not isinstance(record.get("attempts"), int):
        return {"attempts": 0, "runs": [], "message": "an unreadable failure record"}
    return record


def _failure_message(source: Source, exc: BaseException) -> str:
    """What failed, in a line: a gemmgen error's message, else a compiler's last line."""
    if isinstance(exc, GemmgenError):
        return str(exc)
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    detail = lines[-1] if lines else ""
    return f"{source.backend} compile of {source.entry} failed: {type(exc).__name__}: {detail}"


def _final_message(backend: str, key: str, record: dict) -> str:
    return (f"{record.get('message', 'the build failed')} [failed in {record['attempts']} runs, so not tried "
            f"again; to build it once more delete {failed_dir(backend, key)}]")


def _record_failure(source: Source, key: str, tmp: Path, exc: BaseException,
                    previous: Optional[dict]) -> BuildFailed:
    """Keep the attempt's files as <key>.failed/ with its failure.json; the error to raise."""
    backend = source.backend
    where = failed_dir(backend, key)
    message = _failure_message(source, exc).replace(str(tmp), str(where))
    runs = list((previous or {}).get("runs", [])) + [run_id()]
    record = {"format": METADATA_FORMAT, "backend": backend, "key": key, "source": source.digest,
              "attempts": len(set(runs)), "runs": runs, "message": message, "time": time.time()}
    (tmp / "failure.json").write_text(json.dumps(record))
    _install(tmp, where)
    final = record["attempts"] >= BUILD_ATTEMPTS
    return BuildFailed(_final_message(backend, key, record) if final else message, final=final)


def cached_build(source: Source, arch: str, toolchain: str, flags: Sequence[str],
                 compile_fn: Callable[[str, Path], Artifact]) -> Artifact:
    """The artifact for `source`, from the disk cache or from `compile_fn(key, folder)`.

    `compile_fn` writes only into `folder` (a temporary folder of the cache, renamed into
    place when the build is whole) and returns an Artifact whose path, if any, lies in it.
    A failure raises `BuildFailed`; a key that failed in an earlier run is tried once more,
    one that failed in BUILD_ATTEMPTS runs (or earlier in this run) fails at once.
    """
    key = artifact_key(source, arch, toolchain, flags)
    backend = source.backend
    hit = lookup(backend, key, source.digest)
    if hit is not None:
        return hit
    with _key_lock(backend, key):
        hit = lookup(backend, key, source.digest)   # built by another process while this one waited
        if hit is not None:
            return hit
        previous = read_failure(backend, key)
        if previous is not None and previous["attempts"] >= BUILD_ATTEMPTS:
            raise BuildFailed(_final_message(backend, key, previous), final=True)
        if previous is not None and run_id() in previous.get("runs", []):
            raise BuildFailed(f"{previous.get('message')} [failed earlier in this run; tried again in the next]")
        bucket = _bucket(backend, key)
        for stale in bucket.glob(f".tmp-{key}-*"):   # left by a builder that died holding this lock
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=bucket))
        try:
            artifact = compile_fn(key, tmp)
            if artifact.key != key:
                raise BackendError(f"{backend} build returned an artifact keyed {artifact.key!r}, expected {key!r}")
            _write_entry(artifact, tmp, source.digest)
        except Exception as exc:  # noqa: BLE001  every compile failure is recorded, then raised
            try:
                failure = _record_failure(source, key, tmp, exc, previous)
            except OSError:   # the record could not be written (a full disk): the failure still stands
                shutil.rmtree(tmp, ignore_errors=True)
                raise exc from None
            raise failure from exc
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        _install(tmp, entry_dir(backend, key))
        if previous is not None:
            _discard(failed_dir(backend, key))
        built = lookup(backend, key, source.digest)
    if built is None:
        raise BackendError(f"the {backend} build {entry_dir(backend, key)} did not read back; "
                           "check the cache directory's disk")
    return built


def is_cached(source: Source, arch: str, toolchain: str, flags: Sequence[str] = ()) -> bool:
    return artifact_path(source.backend, artifact_key(source, arch, toolchain, flags)).exists()


# ---------------------------------------------------------------------------------------------
# The parallel pool

BuildResult = Union[Artifact, BackendError]


def build_one(source: Source, arch: str = "sm_90a") -> BuildResult:
    """Build through the source's backend; every failure comes back as a BackendError value."""

    try:
        return backends.get(source.backend).build(source, arch)
    except BackendError as exc:
        return exc
    except Exception as exc:  # noqa: BLE001  a compiler's own error: its last line says what failed
        return BackendError(_failure_message(source, exc))


def default_jobs() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def build_many(sources: Sequence[Source], jobs: Optional[int] = None, arch: str = "sm_90a",
               progress: Optional[Callable[[int, BuildResult], None]] = None) -> list[BuildResult]:
    """Build every source, `jobs` at a time, in worker processes; results in input order.

    `progress(index, result)` is called in this process as each build finishes.
    Identical sources are built once. Runs inline when jobs == 1 or there is one source.
    """
    jobs = default_jobs() if jobs is None else max(1, int(jobs))
    results: list[Optional[BuildResult]] = [None] * len(sources)
    first: dict[str, int] = {}
    unique: list[int] = []
    for i, s in enumerate(sources):
        key = f"{s.backend}:{s.digest}"
        if key not in first:
            first[key] = i
            unique.append(i)

    def finish(i: int, result: BuildResult) -> None:
        results[i] = result
        if progress:
            progress(i, result)

    if jobs == 1 or len(unique) <= 1:
        for i in unique:
            finish(i, build_one(sources[i], arch))
    else:

        # spawn, not fork: the parent may hold a CUDA context, which a forked child must not touch.
        # The workers share this run's identity: a failed build is retried in a later run, not a later worker.
        with ProcessPoolExecutor(max_workers=min(jobs, len(unique)), mp_context=mp.get_context("spawn"),
                                 initializer=_adopt_run, initargs=(run_id(),)) as pool:
            futures = {pool.submit(build_one, sources[i], arch): i for i in unique}
            for future in as_completed(futures):
                i = futures[future]
                try:
                    result = future.result()
                except Exception as exc:  # the worker died (a compiler crash): one failed build
                    result = BackendError(f"build worker for {sources[i].entry} died: {type(exc).__name__}: {exc}")
                finish(i, result)
    for i, s in enumerate(sources):
        if results[i] is None:
            j = first[f"{s.backend}:{s.digest}"]
            finish(i, results[j])  # type: ignore[arg-type]
    return results  # type: ignore[return-value]


def partition(results: Iterable[BuildResult]) -> tuple[list[Artifact], list[BackendError]]:
    ok, failed = [], []
    for r in results:
        (failed if isinstance(r, BackendError) else ok).append(r)
    return ok, failed
