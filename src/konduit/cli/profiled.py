"""``python -m konduit.cli.profiled PROFILE ARGS...``: ``konduit ARGS...`` under cProfile, writing
the profile to the file ``PROFILE`` at exit (``konduit bench --profile`` runs its workers so).

``python -m cProfile`` writes its file on a normal exit only, and ``konduit worker`` leaves
through ``os._exit`` (so that abandoned handler threads cannot hold it up): the profile is
written just before that exit instead. It lives with the command line, not the benchmarks, so
that the benchmarks start the command line as a process and never import it."""

from __future__ import annotations

import cProfile
import os
import sys
from typing import NoReturn

from konduit.cli import main


def profiled_main() -> None:
    """Run ``konduit sys.argv[2:]`` profiled, the profile written to ``sys.argv[1]``."""
    path, sys.argv = sys.argv[1], ["konduit", *sys.argv[2:]]
    profiler = cProfile.Profile()
    leave = os._exit

    def dump_then_exit(code: int) -> NoReturn:
        profiler.disable()
        profiler.dump_stats(path)
        leave(code)

    os._exit = dump_then_exit  # type: ignore[assignment]  # the parameter is named differently
    profiler.enable()
    try:
        main()
    finally:
        profiler.disable()
        profiler.dump_stats(path)


if __name__ == "__main__":
    profiled_main()
