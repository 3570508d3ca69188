"""What the GPU test files of generated programs share: build a list of programs in parallel
(through the disk cache), then judge one with the harness (gemmgen.measure.check), the
epilogues each puts its programs through, and the CUDA kernels one call launches."""
from gemmgen.dsl.ir import Epilogue

#: every epilogue item, alone and together, and both other output dtypes
EPILOGUES = (
    Epilogue(bias="n", activation="gelu"),
    Epilogue(alpha=0.5, beta=-1.0, bias="m", activation="relu"),
    Epilogue(activation="silu", residual=True),
    Epilogue(alpha=2.0, beta=0.5, bias="n", activation="gelu", residual=True),
    Epilogue(out_dtype="f32"),
    Epilogue(out_dtype="bf16", bias="n"),
)


def build_all(programs) -> dict:
    """program -> artifact, every program built (`backends.lower`, `build_many`); fails on the
    first that does not build."""
    from gemmgen import backends
    from gemmgen.backends.build import build_many

    results = build_many([backends.lower(p) for p in programs])
    failed = [(p, r) for p, r in zip(programs, results) if isinstance(r, Exception)]
    assert not failed, failed[0]
    return dict(zip(programs, results))


def assert_passes(program, artifact, problem=None, seed: int = 1234):
    """The loaded kernel (`backends.load`) after the harness passed it on `problem` (default the
    program's own)."""
    from gemmgen import backends
    from gemmgen.measure import check

    fn = backends.load(artifact, program)
    result = check(fn, problem or program.problem, seed=seed)
    assert result.passed, (program, result.failures, result.max_rel_err)
    return fn


def launched_kernels(fn, *args, **kwargs) -> list:
    """The names of the CUDA kernels one call of `fn` launches, after a first call (set-up,
    autotuning) outside the profile."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn(*args, **kwargs)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*args, **kwargs)
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type.name == "CUDA"]
