"""How a GPU benchmark script ends when it cannot run: one line saying why, never a traceback.

    if __name__ == "__main__":
        from gpu_main import run_main
        sys.exit(run_main(main))

gemmgen's own errors (a bad shapes file, no GPU, a measurement that could not be made) print
their message. Without a visible GPU, any failure is reported as that, since the script
cannot run here anyway; with one, other exceptions propagate (they are bugs to see in full).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Optional

from gemmgen.compile import gpu_present
from gemmgen.errors import GemmgenError


def run_main(main: Callable[[Optional[list]], int], argv: Optional[list] = None) -> int:
    """main(argv)'s exit status; 2 with one line on stderr where it could not run."""
    name = Path(sys.argv[0]).stem
    try:
        return main(argv)
    except GemmgenError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - without a GPU every failure means the same
        if gpu_present():
            raise
        print(f"{name}: error: it times kernels on an NVIDIA Hopper GPU, and none is visible here "
              f"(stopped at {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
              "run it on the GPU machine", file=sys.stderr)
        return 2
