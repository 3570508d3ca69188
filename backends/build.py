"""Shared build machinery: the disk cache of artifacts and the parallel build pool.

Every backend builds through `cached_build`, so a program compiled once (by a
test, a benchmark, or the tuning loop) is never compiled again for the same
source, toolchain and flags. `build_many` fans sources out over worker
processes: compilers hold the GIL and some are not thread-safe, and a crashed
compile then costs one result, not the run.

Layout under the cache root (env GEMMGEN_CACHE_DIR, default ~/.cache/gemmgen):

    artifacts/<backend>/<key[:2]>/<key>.pkl   the pickled Artifact
    work/<backend>/<key>/                     the compiler's files (sources, PTX, cubin) for inspection
"""
from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import pickle
import tempfile
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence, Union

from gemmgen.backends.base import Artifact, BackendError, Source

from gemmgen import backends
from gemmgen.cache import cache_root as shared_cache_root
from gemmgen.errors import GemmgenError

# Bump when the pickled layout of artifacts changes.
CACHE_FORMAT = "1"


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


def artifact_path(backend: str, key: str) -> Path:
    return cache_root() / "artifacts" / backend / key[:2] / f"{key}.pkl"


def work_dir(backend: str, key: str) -> Path:
    """A directory the compiler may fill; kept so a human can read the PTX later."""
    path = cache_root() / "work" / backend / key
    path.mkdir(parents=True, exist_ok=True)
    return path


def lookup(backend: str, key: str) -> Optional[Artifact]:
    """The cached artifact, or None (a truncated or foreign file counts as a miss)."""
    path = artifact_path(backend, key)
    try:
        with open(path, "rb") as f:
            artifact = pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError):
        return None
    return artifact if isinstance(artifact, Artifact) and artifact.key == key else None


def store(artifact: Artifact) -> None:
    """Write atomically: concurrent builders of the same key each leave a whole file."""
    path = artifact_path(artifact.backend, artifact.key)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(artifact, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def cached_build(source: Source, arch: str, toolchain: str, flags: Sequence[str],
                 compile_fn: Callable[[str, Path], Artifact]) -> Artifact:
    """The artifact for `source`, from the disk cache or from `compile_fn(key, work_dir)`."""
    key = artifact_key(source, arch, toolchain, flags)
    hit = lookup(source.backend, key)
    if hit is not None:
        return hit
    artifact = compile_fn(key, work_dir(source.backend, key))
    if artifact.key != key:
        raise BackendError(f"{source.backend} build returned an artifact keyed {artifact.key!r}, expected {key!r}")
    store(artifact)
    return artifact


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
    except GemmgenError as exc:
        return BackendError(str(exc))
    except Exception as exc:  # a compiler's own error: keep its last line, the one that says what failed
        lines = [line for line in str(exc).strip().splitlines() if line.strip()]
        detail = lines[-1] if lines else ""
        return BackendError(f"{source.backend} compile of {source.entry} failed: {type(exc).__name__}: {detail}")


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
        with ProcessPoolExecutor(max_workers=min(jobs, len(unique)), mp_context=mp.get_context("spawn")) as pool:
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
