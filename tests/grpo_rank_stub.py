"""One torchrun rank of a real GRPO chunk (`gemmgen.policy.training.grpo --distributed`) whose
builder and runner are the STUBS of the tuning tests: trl's data parallelism on the CPU (gloo),
the reward measured on every rank. Run by tests/test_policy_distributed.py."""
import sys

import torch

from gemmgen.policy.training import grpo
from tuning_fakes import FakeBuilder, FakeRunner


class StubWorkerRunner(FakeRunner):
    """STUB runner: FakeRunner's times, built and closed as the WorkerRunner is."""

    def __init__(self, *args, **kwargs):
        super().__init__()


class StubPoolBuilder(FakeBuilder):
    def __init__(self, *args, **kwargs):
        super().__init__()


if __name__ == "__main__":
    torch.set_num_threads(1)
    grpo.WorkerRunner, grpo.PoolBuilder = StubWorkerRunner, StubPoolBuilder
    sys.exit(grpo.main(sys.argv[1:]))
