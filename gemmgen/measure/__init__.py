"""The runner: honest correctness checks, device timing, baselines, isolation."""
