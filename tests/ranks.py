"""Ranks of a torchrun launch as spawned processes on the CPU, for the distributed tests: each
gets the environment torchrun would give it, and the run's store is served by rank 0."""
import multiprocessing as mp
import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world: int, port: int) -> dict:
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world)}


def launch(target, world: int, *args, die=None, timeout_s: float = 120) -> dict:
    """Run `target(env, die_on, results, *args)` as `world` ranks; `die`: {rank: n}, those ranks'
    `die_on` (0 for the others), each expected never to answer. Every other rank's answer (put
    on `results`), by its "rank"."""
    die = die or {}
    ctx = mp.get_context("spawn")
    results, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=target, args=(rank_env(r, world, port), die.get(r, 0), results, *args))
             for r in range(world)]
    for p in procs:
        p.start()
    out = [results.get(timeout=timeout_s) for _ in range(world - len(die))]
    for p in procs:
        p.join(timeout=60)
    return {o["rank"]: o for o in out}
