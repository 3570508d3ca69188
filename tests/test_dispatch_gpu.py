"""Dynamic M on the GPU (pytest -m gpu tests/test_dispatch_gpu.py): a DispatchKernel over the
shipped records serves every M of a range, each kernel passing the harness's checks, and
a call picks the kernel for its operand's M."""
import pytest

pytestmark = pytest.mark.gpu

N, K = 11008, 4096      # Llama-2-7B's gate/up projection; records at M = 1, 2, 4, 8, 16


@pytest.fixture(scope="module")
def dynamic():
    import gemmgen

    return gemmgen.compile((None, N, K), b_major="col")


@pytest.mark.parametrize("m", [3, 4, 6, 8, 12, 16, 17, 100])
def test_every_m_is_served_by_a_checked_kernel(dynamic, m):
    from gemmgen.measure import check

    kernel = dynamic.kernel_for(m)
    assert kernel.problem.m == m
    result = check(kernel.fn, kernel.problem, seed=m)
    assert result.passed, (m, kernel.provenance.summary, result.failures)


def test_a_call_takes_m_from_its_operand(dynamic, shipped_gpu):
    import torch

    w = torch.randn(N, K, device="cuda", dtype=torch.float16)
    for m in (5, 6, 7, 5):
        x = torch.randn(m, K, device="cuda", dtype=torch.float16)
        out = dynamic(x, w.t())
        ref = x.float() @ w.float().t()
        assert out.shape == (m, N)
        assert ((out.float() - ref).norm() / ref.norm()).item() < 2e-3
    # The kernel the call at M = 6 ran is the one its row names: a range on the H200's records
    # (M = 4 and 8 share a winner there), torch.matmul where a GPU's records hold none.
    row, kernel = dynamic.row_for(6), dynamic.kernel_for(6)
    assert kernel.problem.m == 6 and kernel.provenance.how == row.how
    if shipped_gpu == "NVIDIA H200":
        assert row.how == "range"
