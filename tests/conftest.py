"""GPU tests are marked `gpu` and skip cleanly where no CUDA device is present."""
import pytest


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
