"""The Triton launcher's argument assembly, checked on CPU against Triton's own C launcher.

`load` cannot run without a GPU, but what it hands to the C launcher can be checked:
Triton's `make_launcher` generates the C source whose PyArg_ParseTuple format lists,
for the built kernel's signature, exactly which Python values the launch takes (pointers
and descriptors 'O', int32 'i', int64 'L', float 'd', ...). Here the launcher runs on CPU
tensors with a stand-in for the loaded cubin that parses its arguments against that
format, so a wrong count, order or type fails here and not first on the H200.
"""
from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from gemmgen.backends import triton as tb  # noqa: E402
from gemmgen.backends.triton import launch as triton_launch  # noqa: E402
from gemmgen.backends.base import Artifact, BackendError  # noqa: E402
from gemmgen.dsl.ir import Epilogue, Problem, Program, Tile  # noqa: E402

BASE_FORMAT = "iiiKKppOOOOOO"   # grid x3, stream, function, cooperative, pdl, scratch x2, metadata, hooks x3
ACCEPTS = {"i": int, "L": int, "K": int, "d": float, "p": bool}


def _format_of(kernel: dict, tensordesc_meta) -> str:
    from triton.backends.nvidia import driver as nv

    signature = {name: ty for name, ty, _ in kernel["params"]}
    src = nv.make_launcher({}, signature, tensordesc_meta)
    return re.search(r'PyArg_ParseTuple\(args, "([^"]+)"', src).group(1)


def _desc_meta(kernel: dict):
    metas = []
    for _, ty, _ in kernel["params"]:
        if ty.startswith("tensordesc"):
            block = [int(x) for x in re.search(r"\[([^]]*)\]", ty).group(1).split(",")]
            metas.append({"swizzle": 3, "elem_size": 2, "elem_type": 6, "block_size": block, "fp4_padded": False})
    return metas or None


class FakeKernel:
    """Stands in for a loaded cubin: records launches and parses them like Triton's C launcher."""

    def __init__(self, kernel: dict):
        self.tensordesc_meta = _desc_meta(kernel)
        self.format = _format_of(kernel, self.tensordesc_meta)
        self.function, self.packed, self.cooperative, self.pdl = 1234, (4, 1, 0), False, False
        self.launches = []

    def launch(self, *args):
        assert len(args) == len(self.format), (len(args), self.format)
        for value, code in zip(args, self.format):
            if code == "O":
                continue
            want = ACCEPTS[code]
            assert isinstance(value, want) or (want is float and isinstance(value, int)), (code, value)
        self.launches.append(args[len(BASE_FORMAT):])

    @staticmethod
    def make_desc_arg(desc, meta):
        # Triton's version encodes a CUtensorMap from the compiled meta (block_size may be a
        # sub-box of the kernel's block: wide boxes go out as several TMA messages).
        assert len(desc.block_shape) == len(meta["block_size"]) == 2
        return ["DESC", *desc.shape, *desc.strides]


def _launcher(program: Program, monkeypatch):
    src = tb.lower(program)
    art = Artifact(backend="triton", key="k", meta={"kernels": (), "source": src})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    fn = triton_launch.TritonLauncher(art, program)
    fakes = [FakeKernel(k) for k in src.meta["kernels"]]
    monkeypatch.setattr(fn, "_loaded_kernels", lambda device, hinted: fakes)
    monkeypatch.setattr(fn, "_check_device", lambda *t: None)
    fn._raw_stream = lambda device: 77
    return fn, fakes


def _operands(p: Program, m, n, k):
    pr, e = p.problem, p.problem.epilogue
    a = torch.randn(m, k).half() if pr.a_major == "row" else torch.randn(k, m).half().t()
    b = torch.randn(k, n).half() if pr.b_major == "row" else torch.randn(n, k).half().t()
    odt = {"f16": torch.float16, "f32": torch.float32}[e.out_dtype]
    extra = {}
    if e.bias:
        extra["bias"] = torch.randn(n if e.bias == "n" else m).to(odt)
    if e.residual:
        extra["residual"] = torch.randn(m, n).to(odt)
    if e.beta:
        extra["c"] = torch.randn(m, n).to(odt)
    return a, b, torch.empty(m, n, dtype=odt), extra


def program(m, n, k, *, a="row", b="col", epilogue=Epilogue(), **kw):
    return Program(problem=Problem(m, n, k, a_major=a, b_major=b, epilogue=epilogue), backend="triton",
                   tile=Tile(*kw.pop("tile", (128, 128, 64))), warps=(8, 1), mainloop="multistage",
                   stages=kw.pop("stages", 3), **kw)


CASES = [
    program(1000, 3000, 77, epilogue=Epilogue(alpha=2.0, beta=0.5, bias="n", activation="gelu", residual=True)),
    program(256, 512, 1024, a="col", b="row", split_k=4, epilogue=Epilogue(bias="m", activation="relu")),
    program(64, 64, 4096, split_k=8, split_k_reduce="atomic", epilogue=Epilogue(out_dtype="f32")),
    program(1024, 1024, 1024, scheduler="persistent", tile=(128, 256, 64),
            epilogue=Epilogue(bias="n", residual=True)),                       # TMA loads and TMA store
    program(1024, 1000, 1024, a="col", b="row", scheduler="persistent", split_k=2),
    program(None, None, None),
]


@pytest.mark.parametrize("index", range(len(CASES)))
def test_launch_arguments_match_tritons_c_launcher(index, monkeypatch):
    p = CASES[index]
    m, n, k = (p.problem.m, p.problem.n, p.problem.k) if p.problem.is_bound else (300, 200, 100)
    fn, fakes = _launcher(p, monkeypatch)
    a, b, out, extra = _operands(p, m, n, k)
    fn(a, b, out, alpha=p.problem.epilogue.alpha, beta=p.problem.epilogue.beta, **extra)
    fn(a, b, out, alpha=p.problem.epilogue.alpha, beta=p.problem.epilogue.beta, **extra)   # the fast path
    for fake in fakes:
        assert len(fake.launches) == 2 and fake.launches[0] == fake.launches[1]
    first = fakes[0].launches[0]
    values = [v for v in first if v is not None]
    # Tensors go to the launch as their addresses: the bound launches keep no tensor alive.
    assert not any(isinstance(v, torch.Tensor) for v in values)
    assert out.data_ptr() in values or "DESC" in values
    if p.split_k > 1:
        [plan] = fn._plans.values()
        [ws] = plan.workspaces.values()
        assert ws.data_ptr() in values and ws.dtype == torch.float32
        assert ws.numel() == m * n * (1 if p.split_k_reduce == "atomic" else p.split_k)


def test_workspace_is_reused_and_pointers_rebound(monkeypatch):
    p = CASES[1]
    fn, fakes = _launcher(p, monkeypatch)
    a, b, out, extra = _operands(p, 256, 512, 1024)
    fn(a, b, out, **extra)
    a2, b2, out2, extra2 = _operands(p, 256, 512, 1024)
    fn(a2, b2, out2, **extra2)
    first, second = fakes[0].launches
    [plan] = fn._plans.values()
    [ws] = plan.workspaces.values()              # one workspace per (device, stream), no per-call allocation
    assert ws.data_ptr() in first and ws.data_ptr() in second
    assert a2.data_ptr() in second and a.data_ptr() not in second


def test_fast_path_holds_the_previous_call_weakly(monkeypatch):
    """The launcher keeps no reference to a call's tensors (under CUDA graphs inductor refuses a
    pool tensor it does not track); freed, they take the checked path again."""
    import gc
    import weakref

    p = CASES[0]
    fn, fakes = _launcher(p, monkeypatch)
    a, b, out, extra = _operands(p, 1000, 3000, 77)
    fn(a, b, out, alpha=2.0, beta=0.5, **extra)
    gone = weakref.ref(out)
    del out
    gc.collect()
    assert gone() is None
    out = torch.empty(1000, 3000, dtype=torch.float16)
    fn(a, b, out, alpha=2.0, beta=0.5, **extra)
    assert out.data_ptr() in fakes[0].launches[-1]


def test_launcher_refuses_wrong_calls_clearly(monkeypatch):
    p = program(256, 256, 256, b="row", epilogue=Epilogue(bias="n"))
    fn, _ = _launcher(p, monkeypatch)
    a, b, out, extra = _operands(p, 256, 256, 256)
    with pytest.raises(BackendError, match="bias"):
        fn(a, b, out)
    with pytest.raises(BackendError, match="bound"):
        fn(a[:128], b, out[:128], **extra)
    with pytest.raises(BackendError, match="strides"):
        fn(a, b.t().contiguous().t(), out, **extra)
    with pytest.raises(BackendError, match="float16"):
        fn(a.float(), b, out, **extra)
    with pytest.raises(BackendError, match="alpha"):
        fn(a, b, out, alpha=2.0, **extra)


def test_persistent_refuses_unaligned_rows_at_call_time(monkeypatch):
    p = program(None, None, None, scheduler="persistent")
    fn, _ = _launcher(p, monkeypatch)
    a, b, out, _ = _operands(p.bind((64, 64, 77)), 64, 64, 77)
    with pytest.raises(BackendError, match="16 bytes"):
        fn(a, b, out)
