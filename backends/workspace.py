"""Device buffers a launcher keeps from call to call (split-K partials, arrival counters,
CUTLASS's scratch, a cuBLASLt plan's workspace), made outside any CUDA graph's memory pool.

A launcher makes such a buffer on its first call for a shape. Under torch.compile with CUDA
graphs that first call is the graph tree's warm-up, and everything the warming thread allocates
goes to the graph's pool; a buffer kept past it is a live tensor the graph does not track, and
inductor refuses the graph ("tensor(s) in the cudagraph pool not tracked as outputs"). The
pool takes what the warming *thread* allocates, so the buffer is made on a thread of its own.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

_LOCK = threading.Lock()
_ALLOCATOR: ThreadPoolExecutor | None = None


def _allocator() -> ThreadPoolExecutor:
    global _ALLOCATOR
    with _LOCK:
        if _ALLOCATOR is None:
            _ALLOCATOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gemmgen-workspace")
        return _ALLOCATOR


def outside_graph_pool(make, device):
    """`make()`'s result, run where no CUDA graph's pool sees what it allocates: on a thread of
    its own, with `device` current and a side stream current (torch's pool of them: the legacy
    default stream would synchronize with a stream being captured). For what a launcher keeps
    from call to call and makes on its first call (a buffer, a library's plan and workspace)."""
    # Deferred: torch (optional, heavy to import).
    import torch

    device = torch.device(device)

    def run():
        with torch.cuda.device(device), torch.cuda.stream(torch.cuda.Stream(device)):
            return make()

    return _allocator().submit(run).result()


def keep_for_current_stream(buf, device) -> None:
    """Free `buf` (made on a side stream) only after the work queued on `device`'s current
    stream; nothing to do while that stream is being captured (a graph keeps its own)."""
    # Deferred: torch (optional, heavy to import).
    import torch

    if not torch.cuda.is_current_stream_capturing():
        buf.record_stream(torch.cuda.current_stream(device))


def persistent_buffer(numel: int, dtype, device, zero: bool = False):
    """`numel` elements of `dtype` on `device` (zero-filled, and the fill finished, when `zero`),
    for use on the caller's current stream."""
    # Deferred: torch (optional, heavy to import).
    import torch

    device = torch.device(device)
    if device.type != "cuda":           # no CUDA graph to keep out of (the launchers' CPU tests)
        return (torch.zeros if zero else torch.empty)(numel, dtype=dtype, device=device)

    def make():
        buf = (torch.zeros if zero else torch.empty)(numel, dtype=dtype, device=device)
        if zero:
            torch.cuda.current_stream(device).synchronize()
        return buf

    buf = outside_graph_pool(make, device)
    keep_for_current_stream(buf, device)
    return buf
