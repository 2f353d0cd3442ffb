"""DeepSpeed's CPU accelerator gives every rank a shared-memory all-reduce workspace
(/dev/shm/deepspeed_allreduce_buffer_{uid}_{master address}_{port}_{rank}, 66 MiB each; deepspeed 0.19.8
ops/csrc/cpu/comm/shm.cpp shm_initialize) and never unlinks it: shared_close, the only shm_unlink, is never
called. /dev/shm is memory, so every CPU launch leaves 66 MiB per rank behind until the machine restarts
(measured: 332 segments, 22 GiB, left by a day of runs on this machine, which then swapped). The launchers here
remove their own launch's segments once its ranks have exited. GPU jobs do not build this op."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SHM_DIR = Path("/dev/shm")
PREFIX = "deepspeed_allreduce_buffer_"


def launch_segments(port: int | str | None = None) -> set[Path]:
    """This user's DeepSpeed all-reduce segments: of the launch on `port`, or all of them."""
    mine = SHM_DIR.glob(f"{PREFIX}{os.getuid()}_*") if SHM_DIR.is_dir() else ()
    return {p for p in mine if port is None or p.name.rsplit("_", 2)[1] == str(port)}  # ..._{port}_{rank}


def remove_segments(port: int | str) -> int:
    """Unlink the segments of the launch on `port` (its ranks have exited); how many bytes that freed."""
    return _unlink(launch_segments(port))


@contextmanager
def removing_new_segments() -> Iterator[None]:
    """Around code that launches ranks one launch at a time (a test): unlink the segments it left."""
    before = launch_segments()
    try:
        yield
    finally:
        _unlink(launch_segments() - before)


def _unlink(paths: set[Path]) -> int:
    freed = 0
    for path in paths:
        try:
            freed += path.stat().st_size
            path.unlink()
        except FileNotFoundError:  # another cleanup got there first
            pass
    return freed
