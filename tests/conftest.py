"""Suite-wide guard: a test that leaves a launcher's rendezvous variables in this process's environment makes
every later in-process Trainer or DeepSpeed start a process group on the default port 29500 (accelerate reads
LOCAL_RANK as "launched"), where a store another test left may listen: the run then waits for ranks that never
come. Such a test fails here, by name, instead of hanging a later one.

And DeepSpeed's CPU all-reduce segments (/dev/shm, 66 MiB per rank and launch, never unlinked by DeepSpeed:
measure/shm_buffers.py) that a test's launches leave are removed after it, so the suite's few dozen launches do
not fill the machine's memory."""

from __future__ import annotations

import os

import pytest

from measure.shm_buffers import removing_new_segments

RENDEZVOUS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def no_rendezvous_left_behind():
    before = {k: os.environ.get(k) for k in RENDEZVOUS}
    yield
    left = {k: os.environ.get(k) for k in RENDEZVOUS if os.environ.get(k) != before[k]}
    for key, value in before.items():  # put them back, so that one leak fails one test
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    assert not left, f"the test changed the rendezvous environment: {left}"


@pytest.fixture(autouse=True)
def no_deepspeed_segments_left_behind():
    with removing_new_segments():
        yield
