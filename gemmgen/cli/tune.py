"""`gemmgen tune` (fill the tuning database) and `gemmgen compile MxNxK` (what a model compiler gets)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from gemmgen.backends import registry as backend_registry
from gemmgen.compile import as_problem, check_epilogue, clear_cache, compile, parse_epilogue, parse_shape
from gemmgen.compile import gpu_present as has_gpu
from gemmgen.errors import GemmgenError, NoGPUError
from gemmgen.measure.errors import ShapesError
from gemmgen.measure.shapes import PARTS, read_lines, read_shapes, shard
from gemmgen.policy.proposers import POLICY_MODES, proposer_for
from gemmgen.tune import AUTO_BACKENDS, LIBRARY_MIN_GFLOP, LIBRARY_MIN_M, parse_backends, tune_backends
from gemmgen.tune.adapters import PoolBuilder, WorkerRunner, compare_with_torch
from gemmgen.tune.distributed import Rank, connect, pin_gpu, run_rank, tune_one_with
from gemmgen.tune.neighbours import NEIGHBOURS, with_neighbours
from gemmgen.tuning_db import Database, default_db_path, open_layers, problem_from_key


def register(subparsers) -> None:
    tune = subparsers.add_parser(
        "tune", help="propose, build, check, time and record kernels for a list of shapes",
        description="Tune every shape of a CSV (M,N,K columns): propose candidates, build them in "
                    "parallel, check and time each in an isolated worker against baselines measured "
                    "in the same run, and record every trial. Resumable: measured pairs are skipped.")
    tune.add_argument("--shapes", required=True, metavar="FILE",
                      help="CSV of M,N,K[,layout] (layout nn|nt|tn|tt: A then B, n = row-major), or a file "
                           "of problem keys, one a line (8x3584x3584:rcr:f16:f32:bias_n+f16)")
    tune.add_argument("--proposer", default="heuristic", help="heuristic | random | policy | programs")
    tune.add_argument("--policy-mode", choices=POLICY_MODES, default=None,
                      help="with --proposer policy: sample answers (default), rank the spaces' programs, or blend "
                           "(the heuristic's first half of the budget, then the ranking)")
    tune.add_argument("--programs", metavar="PATH", default=None,
                      help="a .gemm file or a folder of them: propose those programs, re-bound to every "
                           "shape of the CSV they fit (implies --proposer programs)")
    tune.add_argument("--budget", type=int, default=8, metavar="N", help="trials per shape (default 8)")
    tune.add_argument("--neighbours", type=int, default=NEIGHBOURS, metavar="N",
                      help=f"first measure the winners of the N nearest tuned problems, re-bound to each shape "
                           f"(default {NEIGHBOURS}; 0: none); gemmgen.compile serves only what was measured at a shape")
    tune.add_argument("--backends", default=AUTO_BACKENDS,
                      help=f"comma-separated backends ({', '.join(backend_registry.NAMES)}); 'cublaslt' adds a "
                           "search of cuBLASLt's own algorithms per shape (docs/tuning.md). Default 'auto': that "
                           f"search where it wins on the records (M >= {LIBRARY_MIN_M} over {LIBRARY_MIN_GFLOP:g} "
                           "GFLOP), then every backend (with --programs: those programs only)")
    tune.add_argument("--db", metavar="PATH", help="database (default: GEMMGEN_DB or "
                                                   "~/.cache/gemmgen/tuning.sqlite)")
    tune.add_argument("--time-budget", type=float, default=None, metavar="S",
                      help="stop starting new trials after S seconds")
    tune.add_argument("--mode", choices=("offline", "both"), default="offline",
                      help="offline: back-to-back device time, L2 flushed (what winners are chosen by); "
                           "both: also server-mode time")
    tune.add_argument("--baselines", default="torch,cublas_nn,cublas_tn,lt_heuristic,lt_autotune",
                      help="baselines timed per shape in the same run; the best is what a winner must beat")
    tune.add_argument("--epilogue", default=None, help="epilogue for every shape, e.g. 'bias=n gelu'")
    tune.add_argument("--seed", type=int, default=0, help="proposal seed (random proposer)")
    tune.add_argument("--jobs", type=int, default=None, help="parallel builds (default: every core)")
    tune.add_argument("--worker-timeout", type=float, default=60.0, metavar="S",
                      help="seconds one candidate may take in the worker before it counts as hung")
    tune.add_argument("--shard", default=None, metavar="I/N", help="tune every N-th shape from the I-th")
    tune.add_argument("--distributed", action="store_true",
                      help="one rank of a torchrun launch: `torchrun --nproc-per-node G -m gemmgen tune "
                           "--distributed ...` shares the shapes out over G GPUs and gathers the records into --db")
    tune.add_argument("--part", choices=PARTS, default="tuning",
                      help="rows of a shapes file with a `# held_out:` line: the tuning part (default: "
                           "held-out families stay unseen), the held-out families, or all")
    tune.add_argument("--no-progress", action="store_true")
    tune.set_defaults(func=_tune)

    comp = subparsers.add_parser(
        "compile", help="the kernel gemmgen.compile gives for a shape: program, provenance, source",
        description="Look a shape up the way gemmgen.compile does and print the chosen program, where "
                    "it came from, and its generated source. With a GPU, also check it and time it "
                    "against torch.matmul. `gemmgen db list` shows the tuned shapes.")
    comp.add_argument("shape", metavar="MxNxK")
    comp.add_argument("--a-major", choices=("row", "col"), default="row")
    comp.add_argument("--b-major", choices=("row", "col"), default="row")
    comp.add_argument("--epilogue", default=None, help="e.g. 'bias=n gelu' or 'alpha=0.5 residual'")
    comp.add_argument("--db", metavar="PATH", help="database laid over the shipped records")
    comp.add_argument("--device", default=None,
                      help="GPU model to look records up for (default: the GPU here, or NVIDIA H200 without one)")
    comp.add_argument("--deterministic", action="store_true",
                      help="pass over programs whose split-K adds partials in arrival order (`unordered`)")
    comp.add_argument("--no-source", action="store_true", help="do not print the generated source")
    comp.add_argument("--no-run", action="store_true", help="do not check or time, even with a GPU")
    comp.set_defaults(func=_compile)


def tune_problems(shapes_file: str, shard_spec: str | None = None, epilogue: str | None = None,
                  part: str = "tuning") -> list:
    """The distinct problems of a shapes CSV (the bench's format and parser), its tuning part by
    default (a layer set's held-out families stay unseen), or of a file of problem keys
    (`key_problems`); optionally one shard, each checked as gemmgen.compile checks a shape."""
    keyed = key_problems(shapes_file)
    if keyed is not None:
        if epilogue:
            raise ShapesError(f"{shapes_file}: a file of problem keys names each problem's epilogue; "
                              "leave out --epilogue")
        return shard(keyed, shard_spec)
    epi = check_epilogue(parse_epilogue(epilogue)) if epilogue else None
    problems = [as_problem(s.problem()) for s in shard(read_shapes(shapes_file, part), shard_spec)]
    return [replace(p, epilogue=epi) for p in problems] if epi else problems


def key_problems(path: str) -> list | None:
    """The distinct problems of a file of problem keys, one a line (`Problem.key`, as `gemmgen db
    show` and the model benchmark's `missing` counts write them: 8x3584x3584:rcr:f16:f32:bias_n+f16),
    in file order; None for a shapes CSV (no line of it holds a ':'). Blank and # lines are skipped."""
    rows = [(i, line.strip()) for i, line in enumerate(read_lines(path), start=1)
            if line.strip() and not line.strip().startswith("#")]
    if not any(":" in text for _, text in rows):
        return None
    problems = []
    for lineno, text in rows:
        try:
            problems.append(as_problem(problem_from_key(text)))
        except GemmgenError as exc:
            raise ShapesError(f"{path}:{lineno}: {exc}; a file of problem keys holds one key a line, "
                              "e.g. 8x3584x3584:rcr:f16:f32:bias_n+f16") from None
    return list(dict.fromkeys(problems))


def _tune(args) -> int:
    # Everything that can be refused is, before the database is opened (or created).
    rank = Rank.from_env() if args.distributed else None
    if rank is not None:
        pin_gpu(rank)                                # before anything initialises CUDA
    library, backends = parse_backends(args.backends)
    if (args.programs or args.proposer == "programs") and args.backends == AUTO_BACKENDS:
        library = False                              # your programs, measured: no library search unasked
    if args.policy_mode and (args.proposer != "policy" or args.programs):
        raise GemmgenError("--policy-mode chooses how the policy proposes; leave it out with another proposer")
    problems = tune_problems(args.shapes, args.shard, args.epilogue, args.part)
    options = {"mode": args.policy_mode} if args.policy_mode else {}
    proposer = (proposer_for(args.proposer, programs=args.programs, backends=backends, **options)
                if backends or args.programs or args.proposer == "programs" else None)   # else the library only
    if not has_gpu():
        raise NoGPUError("gemmgen tune")
    baselines = tuple(b.strip() for b in args.baselines.split(",") if b.strip())
    db_path = Path(args.db) if args.db else default_db_path()
    if rank is not None:
        return _tune_distributed(args, rank, problems, proposer, library, baselines, db_path)
    with WorkerRunner(mode=args.mode, timeout_s=args.worker_timeout, baselines=baselines) as runner, \
            Database(db_path) as db:
        print(f"tuning on {runner.device.name}, database {db_path}")
        if proposer is not None and args.neighbours and not args.programs and args.proposer != "programs":
            proposer = with_neighbours(proposer, db, runner.device.name, args.neighbours)
        tune_backends(problems, library=library, proposer=proposer, builder=PoolBuilder(jobs=args.jobs),
                      runner=runner, db=db, budget=args.budget, time_budget_s=args.time_budget,
                      seed=args.seed, progress=not args.no_progress, announce=print)
        winners = len(db.winners(runner.device.name))
        served = len(db.library_winners(runner.device.name))
    clear_cache()
    print(f"on {runner.device.name} in {db_path}: {winners} problems with a winning program, "
          f"{served} served by a cuBLASLt algorithm")
    return 0


def _tune_distributed(args, rank, problems, proposer, library, baselines, db_path) -> int:
    """One rank of `torchrun ... -m gemmgen tune --distributed` (gemmgen.tune.distributed)."""
    store = connect(rank)
    with WorkerRunner(mode=args.mode, timeout_s=args.worker_timeout, baselines=baselines) as runner:
        print(f"rank {rank.rank}/{rank.world}: tuning on {runner.device.name}, {rank.cores()} build jobs")
        done = run_rank(problems, rank, store, db_path=db_path, tune_one=tune_one_with(
            proposer=proposer, builder=PoolBuilder(jobs=rank.cores()), runner=runner, budget=args.budget,
            time_budget_s=args.time_budget, seed=args.seed, library=library))
    print(f"rank {rank.rank}: {len(done['problems'])} problems tuned")
    if rank.rank == 0:
        lost = f"; ranks {done['lost_ranks']} did not finish (run the same command again to finish their work)" \
            if done["lost_ranks"] else ""
        print(f"gathered {done['merged']} records into {db_path}{lost}")
        clear_cache()
    return 0


def _compile(args) -> int:
    if args.db and not Path(args.db).exists():
        raise GemmgenError(f"--db {args.db}: no tuning database there (`gemmgen tune --db` creates one); "
                           "without --db the shipped records and your default database are read")
    kernel = compile(parse_shape(args.shape), a_major=args.a_major, b_major=args.b_major,
                     epilogue=args.epilogue, device=args.device, db=args.db,
                     deterministic=True if args.deterministic else None)
    gpu_here = has_gpu()
    print(kernel.describe())
    if args.device is None and not gpu_here:
        print(f"(no GPU here: these are the records for {kernel.provenance.gpu}; --device names another GPU model)")
    if kernel.provenance.how == "baseline":
        print("(`gemmgen db list` shows the tuned shapes; `gemmgen tune` tunes more)")
        if args.device is not None:
            layers = open_layers(args.db)
            known = sorted({name for _, layer in layers for name in layer.device_names()})
            for label, layer in layers:
                if label == "user":      # the shipped layer is shared by the process
                    layer.close()
            if args.device not in known:
                print(f"(no records at all name a GPU {args.device!r}; they name {', '.join(map(repr, known))})")
    if not args.no_source:
        print(f"\nsource ({kernel.backend}):")
        print(kernel.source.rstrip())
    if args.no_run:
        return 0
    if not gpu_here:
        print("\n(no GPU here: not checked or timed; on an H200 this command also checks the kernel "
              "and times it against torch.matmul)")
        return 0

    print()
    print(compare_with_torch(kernel))
    return 0
