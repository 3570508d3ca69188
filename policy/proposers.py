"""Baseline proposers: who writes candidate programs before the language model does.

A proposer only proposes: it never compiles or times (the tuning loop does that).

- `HeuristicProposer`: the union of every present backend's `space(problem)` (the
  programs an expert enumerates), ranked by the roofline prior of `gemmgen.backends.ranking`.
  Estimates are compared in 5 % buckets so that near-ties keep the backend's own expert
  order; within a backend the mainloop families near its best estimate take turns, and the
  backends are interleaved, so each is tried.
- `RandomProposer`: uniform over the valid space by rejection sampling: every field drawn
  uniformly from what the chosen backend supports, kept if `gemmgen.dsl.validate` accepts.
- `FileProposer`: the programs of `.gemm` files that a person wrote or a probe picked, re-bound
  to each problem of the same majors, dtypes and epilogue, in file order: how a program found
  outside the tuner (a sweep, a profile) gets checked and recorded like any other.
"""
from __future__ import annotations

import importlib
import random
from pathlib import Path
from typing import Callable, Iterable, Optional, Protocol, Sequence, runtime_checkable

from gemmgen.backends import registry, validate
from gemmgen.backends.ranking import bucket, estimated_seconds, near_first, take_turns
from gemmgen.dsl import parse
from gemmgen.dsl.diagnostics import ProgramError
from gemmgen.dsl.ir import (
    MAINLOOPS,
    SCHEDULERS,
    SPLIT_K_REDUCES,
    Instr,
    Problem,
    Program,
    Tile,
)

from gemmgen.errors import GemmgenError
from gemmgen.files import read_text

ALL_BACKENDS = registry.NAMES
#: A backend's mainloop families whose best estimate is within this factor of its best take
#: turns: the prior cannot tell a direct program from a split multistage one at a few rows of
#: a small weight (on the 1,024-row weights the direct programs measured 6.5-8 us at M = 4-16,
#: the split multistage ones 6.1 us at M = 32), and bucket order alone spent a whole budget of
#: 10 on one family there.
FAMILY_NEAR = 1.25
#: How the policy proposes (`PolicyProposer.mode`): sample answers, rank the spaces' programs, or
#: blend (the heuristic's first half of k, then the model's ranking).
POLICY_MODES = ("sample", "rank", "blend")


def blended(heuristic_order: Sequence, model_order: Sequence, k: int) -> list:
    """The blend mode's k proposals (programs or their texts): the heuristic's first k // 2,
    then the model's order, each once."""
    return list(dict.fromkeys([*heuristic_order[:k // 2], *model_order]))[:k]


@runtime_checkable
class Proposer(Protocol):
    """Writes up to k candidate programs for a problem; same seed, same programs."""

    name: str
    version: str

    def propose(self, problem: Problem, k: int, *, seed: Optional[int] = None) -> list[Program]: ...


def present_backends(names: Iterable[str] = ALL_BACKENDS) -> list:
    """The backend modules of `names`, from the registry."""
    return [registry.get(name) for name in names]


def _validate(program: Program) -> bool:
    try:
        validate(program)
    except ProgramError:
        return False
    return True


def _dedupe(programs: Iterable[Program]) -> list[Program]:
    seen, out = set(), []
    for program in programs:
        if program not in seen:
            seen.add(program)
            out.append(program)
    return out


class HeuristicProposer:
    """The backends' expert spaces, ranked by the roofline prior (module docstring)."""

    name = "heuristic"
    version = "2"

    def __init__(self, backends: Sequence[str] = ALL_BACKENDS, *, validate: bool = True,
                 estimate: Callable[[Program], float] = estimated_seconds):
        self.backends = tuple(backends)
        self.validate = validate
        self.estimate = estimate

    def backend_order(self, problem: Problem, module) -> list[Program]:
        """One backend's space in the prior's order (5 % buckets, then the expert's order), its
        mainloop families near the best estimate taking turns, then the families far behind."""
        space = _dedupe(prog.bind(problem) for prog in module.space(problem))
        if self.validate:
            space = [prog for prog in space if _validate(prog)]
        estimates = [self.estimate(prog) for prog in space]
        order = sorted(range(len(space)), key=lambda i: (bucket(estimates[i]), i))
        families: dict[str, list[int]] = {}
        for i in order:
            families.setdefault(space[i].mainloop, []).append(i)
        return near_first([[space[i] for i in f] for f in families.values()],
                          [estimates[f[0]] for f in families.values()], FAMILY_NEAR,
                          best=min(estimates, default=None))

    def ranked(self, problem: Problem) -> list[Program]:
        per_backend = [progs for progs in (self.backend_order(problem, module)
                                           for module in present_backends(self.backends)) if progs]
        per_backend.sort(key=lambda progs: self.estimate(progs[0]))
        return take_turns(per_backend)

    def propose(self, problem: Problem, k: int, *, seed: Optional[int] = None) -> list[Program]:
        return self.ranked(problem)[:k]


# Values the random proposer draws from, before the backend's SUPPORT narrows them.
TILE_MN = (16, 32, 64, 128, 192, 256)
TILE_K = (16, 32, 64, 128)
WARPS = ((1, 1), (1, 2), (2, 1), (2, 2), (1, 4), (4, 1), (2, 4), (4, 2), (1, 8), (8, 1))
CLUSTERS = ((1, 1), (1, 2), (2, 1), (2, 2), (1, 4), (4, 1))
STAGES = (2, 3, 4, 5, 6, 7)
SWIZZLES = (1, 2, 4, 8, 16)
SPLIT_K = (1, 1, 1, 2, 3, 4, 8)
WGMMA_N = (64, 128, 192, 256)


class RandomProposer:
    """Uniform over the valid space, by drawing every field and keeping what validates."""

    name = "random"
    version = "1"

    def __init__(self, backends: Sequence[str] = ALL_BACKENDS, *, max_draws_per_program: int = 400):
        self.backends = tuple(backends)
        self.max_draws_per_program = max_draws_per_program

    def draw(self, problem: Problem, module, rng: random.Random) -> Program:
        support = module.SUPPORT
        pick = rng.choice
        instr_kind = pick(sorted(support.instr_kinds, key=str))
        instr = None
        if instr_kind == "wgmma":
            instr = Instr("wgmma", 64, pick(WGMMA_N), 16)
        elif instr_kind == "mma":
            instr = Instr("mma", 16, 8, 16)
        clusters = [c for c in CLUSTERS if c[0] * c[1] <= support.max_cluster]
        stages = list(STAGES) + ([None] if support.auto_stages else [])
        split_k = pick(SPLIT_K)
        return Program(
            problem=problem,
            backend=module.NAME,
            tile=Tile(pick(TILE_MN), pick(TILE_MN), pick(TILE_K)),
            warps=pick(WARPS),
            mainloop=pick(sorted(m for m in support.mainloops if m in MAINLOOPS)),
            instr=instr,
            cluster=pick(clusters),
            stages=pick(stages),
            scheduler=pick(sorted(s for s in support.schedulers if s in SCHEDULERS)),
            raster=pick(("m", "n")),
            swizzle=pick(SWIZZLES),
            smem_swizzle=pick(sorted(support.smem_swizzles, key=lambda s: -1 if s is None else s)),
            split_k=split_k,
            split_k_reduce=pick(sorted(r for r in support.split_k_reduces if r in SPLIT_K_REDUCES))
            if split_k > 1 else "workspace",
        )

    def propose(self, problem: Problem, k: int, *, seed: Optional[int] = None) -> list[Program]:
        modules = present_backends(self.backends)
        if not modules or k <= 0:
            return []
        rng = random.Random(seed)
        found: list[Program] = []
        seen: set[Program] = set()
        for _ in range(k * self.max_draws_per_program):
            program = self.draw(problem, rng.choice(modules), rng)
            if program in seen:
                continue
            seen.add(program)
            if _validate(program):
                found.append(program)
                if len(found) == k:
                    break
        return found


class FileProposer:
    """Programs from `.gemm` files (one file, or every file of a folder in name order),
    re-bound to each problem they fit: same majors, dtypes and epilogue, valid at its shape."""

    name = "programs"
    version = "1"

    def __init__(self, path: Optional[str] = None, backends: Sequence[str] = ALL_BACKENDS):
        if not path:
            raise ProposerError("the programs proposer reads .gemm files: give them with --programs FILE_OR_FOLDER")
        root = Path(path)
        files = sorted(root.glob("*.gemm")) if root.is_dir() else [root]
        if not files or not all(f.is_file() for f in files):
            raise ProposerError(f"--programs {path}: no .gemm file there (give a DSL file or a folder of them)")
        programs = []
        for f in files:
            try:
                programs.append(parse(read_text(f, "a DSL program (.gemm)", ProposerError)))
            except ProgramError as exc:
                raise ProposerError(f"--programs: {f}: {exc}") from None
        self.backends = tuple(backends)
        self.programs = _dedupe(programs)

    def propose(self, problem: Problem, k: int, *, seed: Optional[int] = None) -> list[Program]:
        def fits(p: Program) -> bool:
            return p.backend in self.backends and p.problem.with_shape(problem.m, problem.n, problem.k) == problem

        bound = (p.bind(problem) for p in self.programs if fits(p))
        return _dedupe(b for b in bound if _validate(b))[:k]


class ProposerError(GemmgenError):
    """An unknown proposer name, or a proposer that cannot start (no programs to read)."""


# name -> a factory or "module:attribute" (imported on first use). The policy adds "policy".
_REGISTRY: dict[str, Callable[..., Proposer] | str] = {
    "heuristic": HeuristicProposer,
    "random": RandomProposer,
    "programs": FileProposer,
    "policy": "gemmgen.policy.lm_proposer:PolicyProposer",
}


def register_proposer(name: str, factory: Callable[..., Proposer] | str) -> None:
    """Make `get_proposer(name)` build proposers with `factory` (or the 'module:attr' it names)."""
    _REGISTRY[name] = factory


def proposer_names() -> list[str]:
    return sorted(_REGISTRY)


def get_proposer(name: str, **options) -> Proposer:
    """A proposer by name; `options` (e.g. backends=...) go to its constructor."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ProposerError(f"unknown proposer {name!r}; choose one of {', '.join(proposer_names())}") from None
    if isinstance(factory, str):
        module, _, attr = factory.partition(":")
        factory = getattr(importlib.import_module(module), attr)
    return factory(**options)


def proposer_for(name: str, *, programs: Optional[str] = None, backends: Sequence[str] = (),
                 **options) -> Proposer:
    """The proposer a command line names (`gemmgen tune`, `gemmgen propose`): `--programs PATH`
    means the file proposer, which keeps every backend's files unless `backends` narrows them."""
    if programs or name == "programs":     # FileProposer says so if no path
        return get_proposer("programs", path=programs, backends=tuple(backends) or ALL_BACKENDS)
    return get_proposer(name, **({"backends": tuple(backends)} if backends else {}), **options)


__all__ = ["FileProposer", "HeuristicProposer", "POLICY_MODES", "Proposer", "ProposerError", "RandomProposer", "blended",
           "estimated_seconds", "get_proposer", "present_backends", "proposer_for", "proposer_names",
           "register_proposer"]
