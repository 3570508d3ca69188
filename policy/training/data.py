"""Which problems the policy trains on and which it is judged on, and the supervised examples.

The held-out set is fixed: 20 % of `benchmarks/shapes/cudal2_1000.csv` chosen by a
seeded hash of the shape, plus the off-grid `x @ W.T` problems M in {1, 7, 33, 1000,
3000}, N = 11008, K = 4096, plus every width (N, K) of the layer set's held-out families
(`benchmarks/shapes/llm_layers.csv`, its `# held_out:` line) that no tuning family shares,
at any M. Nothing here ever yields a held-out problem for training. The layer set's tuning
part is trained on, as the `x @ W.T` problems it is.

The unseen set is what the any-shape issue judges the policy on: the layer set's held-out
families at their own widths (every M, `x @ W.T`) and random off-grid shapes, each with B
row-major and column-major, none of them a training problem.

Supervised examples come from two sources, kept apart by name:
- `database_examples`: the tuning database's fastest checked programs per problem, i.e.
  programs *measured* on the GPU (winners over cuBLAS or not: what the policy is judged
  against is the fastest program the database holds);
- `heuristic_examples`: the HeuristicProposer's top programs, i.e. *imitation of the
  roofline heuristic*, not measurements. They give the warm start something to learn
  before any GPU tuning exists.
"""
from __future__ import annotations

import csv
import hashlib
import json
import random
import warnings
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Iterator, Optional

from gemmgen.dsl import ProgramError, parse, to_text
from gemmgen.dsl.ir import Epilogue, Problem, Program
from gemmgen.policy.prompt import example_text
from gemmgen.policy.proposers import HeuristicProposer
from gemmgen.tuning_db import DEFAULT_DEVICE_NAME

from gemmgen.errors import GemmgenError

HELDOUT_SALT = "gemmgen-policy-heldout-v1"
HELDOUT_PERCENT = 20
OFFGRID_M = (1, 7, 33, 1000, 3000)
OFFGRID_N, OFFGRID_K = 11008, 4096
UNSEEN_SEED = 20261202
UNSEEN_RANDOM = 100
SHAPES_CSV = "benchmarks/shapes/cudal2_1000.csv"
LAYERS_CSV = "benchmarks/shapes/llm_layers.csv"

# Widths of common transformer layers: the off-grid training shapes draw N and K from these.
MODEL_DIMS = (512, 768, 1024, 1536, 2048, 2560, 3072, 3584, 4096, 5120, 6144, 8192, 11008,
              12288, 13824, 14336, 16384, 28672)
EPILOGUE_VARIANTS = (Epilogue(), Epilogue(bias="n"), Epilogue(bias="n", activation="gelu"),
                     Epilogue(activation="silu"), Epilogue(residual=True), Epilogue(alpha=0.5, beta=1.0))


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def grid_shapes(path: Optional[str | Path] = None) -> list[tuple[int, int, int]]:
    """The 1,000 (M, N, K) shapes of the CUDA-L2 set, in file order."""
    path = Path(path) if path else repo_root() / SHAPES_CSV
    if not path.is_file():

        raise GemmgenError(f"{path}: the shape list is missing; run from a gemmgen checkout")
    with open(path, newline="") as f:
        return [(int(r["M"]), int(r["N"]), int(r["K"])) for r in csv.DictReader(f)]


def layer_rows(path: Optional[str | Path] = None) -> tuple[list[tuple[int, int, int, str]], frozenset]:
    """The layer set's rows as (M, N, K, model) and its held-out families (read here, not
    through gemmgen.measure: the training room does not import the runner)."""
    path = Path(path) if path else repo_root() / LAYERS_CSV
    if not path.is_file():
        raise GemmgenError(f"{path}: the layer set is missing; run from a gemmgen checkout")
    lines = path.read_text().splitlines()
    held = frozenset(name.strip() for line in lines if line.startswith("# held_out:")
                     for name in line.split(":", 1)[1].split(",") if name.strip())
    rows = [r for r in csv.DictReader(line for line in lines if not line.startswith("#"))]
    return [(int(r["M"]), int(r["N"]), int(r["K"]), r["model"]) for r in rows], held


@lru_cache(maxsize=1)
def heldout_widths() -> frozenset:
    """(N, K) of the layer set's held-out families that no tuning family has."""
    rows, held = layer_rows()
    tuning = {(n, k) for _, n, k, model in rows if model not in held}
    return frozenset((n, k) for _, n, k, model in rows if model in held and (n, k) not in tuning)


def layer_training_shapes() -> list[tuple[int, int, int]]:
    """The layer set's tuning part, each (M, N, K) once."""
    rows, held = layer_rows()
    return list(dict.fromkeys((m, n, k) for m, n, k, model in rows if model not in held))


def is_heldout_shape(m: int, n: int, k: int) -> bool:
    """The fixed 20 % of grid shapes the policy never trains on (seeded hash)."""
    digest = hashlib.sha256(f"{HELDOUT_SALT}:{m}x{n}x{k}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 100 < HELDOUT_PERCENT


def is_offgrid_heldout(m: int, n: int, k: int) -> bool:
    return m in OFFGRID_M and n == OFFGRID_N


def heldout_problems(grid: Optional[Iterable[tuple[int, int, int]]] = None) -> list[Problem]:
    """Held-out grid shapes (A, B row-major, as torch.matmul takes them), then the off-grid x @ W.T."""
    grid = grid_shapes() if grid is None else grid
    problems = [Problem(m, n, k) for m, n, k in grid if is_heldout_shape(m, n, k)]
    problems += [Problem(m, OFFGRID_N, OFFGRID_K, b_major="col") for m in OFFGRID_M]
    return problems


def is_heldout(problem: Problem) -> bool:
    m, n, k = problem.m, problem.n, problem.k
    return (is_heldout_shape(m, n, k) or is_offgrid_heldout(m, n, k) or (n, k) in heldout_widths()
            or (m, n, k) in unseen_random_shapes())


def heldout_layer_problems() -> list[Problem]:
    """The layer set's held-out families at their held-out widths, `x @ W.T`, each (M, N, K) once."""
    rows, held = layer_rows()
    widths = heldout_widths()
    shapes = dict.fromkeys((m, n, k) for m, n, k, model in rows if model in held and (n, k) in widths)
    return [Problem(m, n, k, b_major="col") for m, n, k in shapes]


def log_uniform_shape(rng: random.Random) -> tuple[int, int, int]:
    """A shape as a new user brings one: each side log-uniform (M 1-8192, N and K 16-16384)."""
    return int(2 ** rng.uniform(0, 13)), int(2 ** rng.uniform(4, 14)), int(2 ** rng.uniform(4, 14))


@lru_cache(maxsize=1)
def unseen_random_shapes() -> tuple[tuple[int, int, int], ...]:
    """UNSEEN_RANDOM log-uniform shapes, none a grid shape, fixed by UNSEEN_SEED: held out of
    all training (is_heldout), in both majors and with any epilogue."""
    rng, grid = random.Random(UNSEEN_SEED), set(grid_shapes())
    shapes: dict[tuple[int, int, int], None] = {}
    while len(shapes) < UNSEEN_RANDOM:
        s = log_uniform_shape(rng)
        if s not in grid:
            shapes[s] = None
    return tuple(shapes)


def unseen_random_pairs() -> list[tuple[Problem, Problem]]:
    """Each unseen random shape with B row-major and with B column-major (the A operand
    row-major, as models hold activations)."""
    return [(Problem(m, n, k, b_major="row"), Problem(m, n, k, b_major="col")) for m, n, k in unseen_random_shapes()]


def unseen_problems() -> list[Problem]:
    """The held-out layers, then the unseen random shapes in both majors."""
    return heldout_layer_problems() + [p for pair in unseen_random_pairs() for p in pair]


def training_problems(seed: int = 0, offgrid: int = 400, epilogue_fraction: float = 0.35,
                      layers: bool = True, user_shapes: int = 0) -> list[Problem]:
    """Grid shapes outside the held-out 20 %, each row/row and x @ W.T (b=col), plus off-grid
    shapes of model widths, plus `user_shapes` log-uniform ones (as a new user brings them, from
    their own random stream, so the others stay as they were); then (`layers`) the layer set's
    tuning part as x @ W.T.

    A random `epilogue_fraction` of grid and off-grid shapes also gets a third problem with a
    random epilogue, so the prompt's epilogue line is seen with many shapes.
    """
    rng = random.Random(seed)
    shapes = [s for s in grid_shapes() if not is_heldout(Problem(*s))]
    seen = set(shapes)
    target = len(shapes) + offgrid
    while len(shapes) < target:
        m = int(round(2 ** rng.uniform(0, 14)))
        n, k = rng.choice(MODEL_DIMS), rng.choice(MODEL_DIMS)
        if rng.random() < 0.3:
            n, k = rng.randint(1, 16384), rng.randint(16, 16384)
        s = (m, n, k)
        if s not in seen and not is_heldout(Problem(*s)):
            seen.add(s)
            shapes.append(s)
    user_rng = random.Random(f"{seed}:user-shapes")
    while len(shapes) < target + user_shapes:
        s = log_uniform_shape(user_rng)
        if s not in seen and not is_heldout(Problem(*s)):
            seen.add(s)
            shapes.append(s)
    problems = []
    for m, n, k in shapes:
        for b_major in ("row", "col"):
            problems.append(Problem(m, n, k, b_major=b_major))
        if rng.random() < epilogue_fraction:
            problems.append(Problem(m, n, k, b_major=rng.choice(("row", "col")),
                                    epilogue=rng.choice(EPILOGUE_VARIANTS[1:])))
    if layers:   # the grid's hashed fifth applies to any shape, these included
        problems += [p for p in (Problem(m, n, k, b_major="col") for m, n, k in layer_training_shapes())
                     if not is_heldout(p)]
    return list(dict.fromkeys(problems))


def heuristic_examples(problems: Iterable[Problem], top: int = 4,
                       cache: Optional[Path] = None) -> list[Program]:
    """The HeuristicProposer's top `top` programs per problem (imitation data, not measured).

    The list is cached as canonical text (JSON lines) because ranking costs ~60 ms a problem.
    """

    problems = list(problems)
    proposer = HeuristicProposer()
    if cache and cache.is_file():
        return [parse(json.loads(line)["program"]) for line in cache.read_text().splitlines() if line]
    programs: list[Program] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for problem in problems:
            programs.extend(proposer.propose(problem, top))
    if cache:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(".partial")
        tmp.write_text("".join(json.dumps({"program": to_text(p)}) + "\n" for p in programs))
        tmp.rename(cache)
    return programs


def database_examples(db, device_name: Optional[str] = None, top: int = 2) -> list[Program]:
    """The `top` fastest checked programs of each problem the database tuned on this GPU
    (measured), by speedup over the best baseline of their own run; held-out problems never."""
    programs = []
    for problem, speedups in measured_programs(db, device_name).items():
        for text, _ in sorted(speedups.items(), key=lambda item: (-item[1], item[0]))[:top]:
            program = _recorded_program(text, problem)
            if program is not None:
                programs.append(program)
    return programs


def _recorded_program(text: str, problem: Problem) -> Optional[Program]:
    """A record's program text bound to its problem; None where it no longer parses."""
    try:
        return replace(parse(text).bind(problem), problem=problem)
    except ProgramError:
        return None


def measured_programs(db, device_name: Optional[str] = None) -> dict[Problem, dict[str, float]]:
    """Problem -> {program text: its best speedup over the best baseline of its run}, for the
    checked trials of each bound training problem the database holds on this GPU (measured);
    held-out problems never."""
    speedups: dict[Problem, dict[str, float]] = {}
    for trial in db.trials(device_name=device_name or DEFAULT_DEVICE_NAME):
        if (trial.status == "ok" and trial.check_passed and trial.speedup
                and trial.problem.is_bound and not is_heldout(trial.problem)):
            texts = speedups.setdefault(trial.problem, {})
            texts[trial.program] = max(texts.get(trial.program, 0.0), trial.speedup)
    return speedups


def preference_examples(db, device_name: Optional[str] = None, *, min_gain: float = 1.05,
                        per_problem: int = 8, seed: int = 0) -> list[tuple[Program, Program]]:
    """(faster, slower) pairs of programs measured at the same training problem, the faster at
    least `min_gain` times the slower's speedup (wider than the timing noise), at most
    `per_problem` a problem, drawn with a seeded generator: measured preferences, no heuristic."""
    rng, pairs = random.Random(seed), []
    for problem, speedups in measured_programs(db, device_name).items():
        ranked = sorted(speedups.items(), key=lambda item: (-item[1], item[0]))
        apart = [(a, b) for i, (a, fast) in enumerate(ranked) for b, slow in ranked[i + 1:]
                 if fast >= slow * min_gain]
        for faster, slower in rng.sample(apart, min(per_problem, len(apart))):
            pair = (_recorded_program(faster, problem), _recorded_program(slower, problem))
            if None not in pair:
                pairs.append(pair)
    return pairs


def preference_rows(pairs: Iterable[tuple[Program, Program]]) -> Iterator[dict]:
    """Prompt/chosen/rejected rows for trl's DPOTrainer."""
    for faster, slower in pairs:
        prompt, chosen = example_text(faster)
        yield {"prompt": prompt, "chosen": chosen, "rejected": example_text(slower)[1]}


def supervised_rows(programs: Iterable[Program]) -> Iterator[dict]:
    """Prompt/completion rows for trl's SFTTrainer."""

    for program in programs:
        prompt, answer = example_text(program)
        yield {"prompt": prompt, "completion": answer}
