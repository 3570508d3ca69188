"""`gemmgen propose`: the policy's k programs for a shape, printed as DSL text (CPU is enough)."""
from __future__ import annotations

import sys
import warnings
from dataclasses import replace

from gemmgen.compile import as_problem, parse_epilogue, parse_shape
from gemmgen.dsl import to_text
from gemmgen.dsl.ir import Problem
from gemmgen.errors import GemmgenError
from gemmgen.policy.proposers import POLICY_MODES, proposer_for


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "propose", help="programs the policy (a language model) proposes for a shape",
        description="Sample k programs from the policy under the DSL grammar, drop duplicates and those "
                    "the validator refuses, and print them (the greedy answer first); or, with --mode rank, "
                    "print the k programs of the backends' spaces the policy finds most likely. Runs on the CPU.")
    p.add_argument("--shape", required=True, metavar="MxNxK")
    p.add_argument("--a-major", choices=("row", "col"), default="row")
    p.add_argument("--b-major", choices=("row", "col"), default="row",
                   help="col: B is W.T of a weight W (N x K), the x @ W.T of nn.Linear")
    p.add_argument("--c-major", choices=("row", "col"), default="row")
    p.add_argument("--epilogue", default=None, help="e.g. 'bias=n gelu' or 'alpha=0.5 residual'")
    p.add_argument("-k", type=int, default=8, help="how many programs (default 8)")
    p.add_argument("--checkpoint", metavar="PATH", help="a trained policy folder (default: the shipped one)")
    p.add_argument("--base-model", metavar="PATH",
                   help="a local Hugging Face causal LM folder or .gguf file to sample from instead")
    p.add_argument("--proposer", default="policy", help="policy | heuristic | random | programs (to compare)")
    p.add_argument("--programs", metavar="PATH", default=None,
                   help="a .gemm file or a folder of them, re-bound to --shape (implies --proposer programs)")
    p.add_argument("--backends", default=None, help="comma-separated backends to keep (default: all)")
    p.add_argument("--mode", choices=POLICY_MODES, default=None,
                   help="the policy's way to propose: sample answers, rank the spaces' programs, or "
                        "blend (the heuristic's first half of -k, then the ranking; default: sample)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stats", action="store_true", help="also print how many samples were kept and why not")
    p.set_defaults(func=_propose)


def _problem(args) -> Problem:
    """The checked problem of --shape, --*-major and --epilogue (as gemmgen.compile checks it)."""
    m, n, k = parse_shape(args.shape)
    problem = Problem(m, n, k, a_major=args.a_major, b_major=args.b_major, c_major=args.c_major)
    if args.epilogue:
        problem = replace(problem, epilogue=parse_epilogue(args.epilogue))
    return as_problem(problem)


#: The policy's sample counts (PolicyProposer.last_stats) in words.
_DROPPED = {"duplicate": "repeated an earlier program", "invalid": "refused by the validator",
            "incomplete": "cut off", "unparsed": "not a program", "other_backend": "for another backend"}


def _shortfall(proposer, problem: Problem, asked: int, got: int) -> str:
    """Why fewer programs than asked came back: each proposer returns distinct valid ones only."""
    stats = getattr(proposer, "last_stats", None) or {}
    if proposer.name == "policy" and getattr(proposer, "mode", None) == "rank":
        why = f"the backends' spaces hold {stats.get('space', got)} valid programs for {problem.key}"
    elif proposer.name == "policy" and stats:
        dropped = ", ".join(f"{v} {_DROPPED.get(k, k)}" for k, v in stats.items() if k in _DROPPED and v)
        why = (f"the policy sampled {stats.get('sampled', 0)} answers and only {got} were distinct valid "
               f"programs ({dropped or 'none dropped'}); another --seed or a higher --temperature may find more")
    elif proposer.name == "programs":
        why = (f"only {got} of the given programs fit {problem.key} (its majors, dtypes and epilogue, and "
               "valid at its shape)")
    elif proposer.name == "random":
        why = f"the random proposer found only {got} distinct valid programs within its draws"
    else:
        why = f"the {proposer.name} proposer has only {got} distinct valid programs for {problem.key}"
    return f"{got} of the {asked} programs asked for: {why}"


def _propose(args) -> int:
    # The arguments are checked before the proposer (and its model) is loaded.
    if args.k <= 0:
        raise GemmgenError("-k must be at least 1")
    if args.mode and (args.proposer != "policy" or args.programs):
        raise GemmgenError("--mode chooses how the policy proposes; leave it out with another proposer")
    problem = _problem(args)
    backends = tuple(b.strip() for b in args.backends.split(",") if b.strip()) if args.backends else ()
    options = (dict(checkpoint=args.checkpoint, base_model=args.base_model, temperature=args.temperature,
                    **({"mode": args.mode} if args.mode else {}))
               if args.proposer == "policy" and not args.programs else {})
    proposer = proposer_for(args.proposer, programs=args.programs, backends=backends, **options)
    name = proposer.name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        programs = proposer.propose(problem, args.k, seed=args.seed)
    for i, program in enumerate(programs, 1):
        print(f"# program {i} of {len(programs)} ({proposer.name})")
        print(to_text(program))
    stats = getattr(proposer, "last_stats", None)
    if args.stats and stats:
        print("# samples: " + ", ".join(f"{k} {v}" for k, v in stats.items()))
    if programs and len(programs) < args.k:
        print(f"gemmgen: note: {_shortfall(proposer, problem, args.k, len(programs))}", file=sys.stderr)
    if not programs:
        hint = ("none of the files is of this problem's majors, dtypes and epilogue, or valid at its shape"
                if name == "programs" else "try a larger -k or another --checkpoint")
        raise GemmgenError(f"the {name} proposer found no valid program for {problem.key}; {hint}")
    return 0
