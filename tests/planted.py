"""Kernels planted to prove the runner survives them: CPU jobs (Job.problem is None).

Each function is a `load` for a Job and returns the no-argument 'kernel' the worker calls.
"""
from __future__ import annotations

import ctypes
import os
import time
from typing import Callable


def sleeps_forever() -> Callable[[], None]:
    return lambda: time.sleep(1e6)


def aborts() -> Callable[[], None]:
    return os.abort


def segfaults() -> Callable[[], None]:
    return lambda: ctypes.string_at(0)


def raises(message: str = "planted failure") -> Callable[[], None]:
    def kernel() -> None:
        raise RuntimeError(message)
    return kernel


def spawns_and_hangs(pid_file: str) -> Callable[[], None]:
    """Starts a grandchild that sleeps (its pid written to `pid_file`), then hangs itself."""
    import subprocess
    import sys

    def kernel() -> None:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1000)"])
        with open(pid_file, "w") as f:
            f.write(str(child.pid))
        time.sleep(1e6)
    return kernel


def returns() -> Callable[[], None]:
    return lambda: None


_JOBS_HERE = 0


def counts_jobs() -> Callable[[], tuple]:
    """A plain job whose value is (this process's pid, jobs of this kind it has run)."""
    global _JOBS_HERE
    _JOBS_HERE += 1
    seen = _JOBS_HERE
    return lambda: (os.getpid(), seen)


def returns_value(half):
    """Returns {'answer': 2 * half}; with half=None, something that cannot be pickled."""
    if half is None:
        return lambda: (lambda: None)
    return lambda: {"answer": 2 * half}


# ---- GPU kernels with the kernel calling convention (loaders for Jobs with a problem) ----

def torch_matmul() -> Callable:
    """A correct kernel: the run goes on after the planted failures."""
    import torch

    def fn(a, b, out, **_):
        torch.matmul(a, b, out=out)
    return fn


def spins_on_gpu() -> Callable:
    from planted_gpu import spin
    return spin


def faults_on_gpu() -> Callable:
    from planted_gpu import poke
    return poke
