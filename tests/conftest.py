"""GPU tests are marked `gpu` and skip cleanly where no CUDA device is present. Every test,
and every process a test starts, keeps gemmgen's caches and databases in a temporary folder,
never the user's ~/.cache/gemmgen (GEMMGEN_TEST_CACHE_DIR names a folder to reuse instead, so
that a GPU run can keep its built kernels between sessions)."""
import os
import shutil
import tempfile

import pytest

from gemmgen.cache import CACHE_ENV

DB_ENV = "GEMMGEN_DB"
PREPACK_ENV = "TORCHINDUCTOR_CPP_WEIGHT_PREPACK"
_SAVED = pytest.StashKey[dict]()


def pytest_configure(config):
    # Before collection, so that nothing imported or started by a test sees the user's folders.
    reuse = os.environ.get("GEMMGEN_TEST_CACHE_DIR")
    root = reuse or tempfile.mkdtemp(prefix="gemmgen-tests-")
    config.stash[_SAVED] = {"made": None if reuse else root,
                            "env": {name: os.environ.get(name) for name in (CACHE_ENV, DB_ENV, PREPACK_ENV)}}
    os.environ[CACHE_ENV] = root
    os.environ[DB_ENV] = os.path.join(root, "tuning.sqlite")
    # On CPUs with AMX, inductor's freezing packs constant weights into oneDNN linears before the
    # post-grad passes, so the CPU tests of gemmgen's pass would find no mm to replace; inductor
    # on CUDA, which those tests stand in for, has no such step.
    os.environ.setdefault(PREPACK_ENV, "0")


def pytest_unconfigure(config):
    saved = config.stash.get(_SAVED, None)
    if saved is None:
        return
    for name, value in saved["env"].items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    if saved["made"]:
        shutil.rmtree(saved["made"], ignore_errors=True)


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (run on the H200 with -m gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def runner():
    """The harness's isolated worker for a GPU test module: a fault costs one case, not the module."""
    from gemmgen.measure import Runner

    with Runner(timeout_s=120) as r:
        yield r


@pytest.fixture(autouse=True)
def _no_on_demand_workers_left():
    """On-demand tuning keeps its workers for the process's next request; a test's runner (often a
    fake) must not serve the next test."""
    yield
    from gemmgen.tune.on_demand import release_workers

    release_workers()


@pytest.fixture(scope="session")
def shipped_gpu():
    """For GPU tests of what the shipped records serve: skips on a GPU model they hold no
    record of (those tests' kernels serve only where they were measured)."""
    import torch

    from gemmgen.tuning_db import shipped_database

    name = torch.cuda.get_device_name()
    if name not in shipped_database().device_names():
        pytest.skip(f"the shipped records hold no measurement on {name}")
    return name


@pytest.fixture
def fresh_dynamo():
    """A clean dynamo and empty torch-backend stats before the test; dynamo reset after it."""
    # Deferred: torch, only for the tests that compile.
    import torch

    from gemmgen.torch_compile import backend as torch_backend

    torch._dynamo.reset()
    torch_backend.reset_stats()
    yield
    torch._dynamo.reset()
