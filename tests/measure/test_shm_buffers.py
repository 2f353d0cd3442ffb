"""The DeepSpeed all-reduce segments a launch leaves in /dev/shm are removed: only that launch's (by port), or
only those a block of code made."""

from __future__ import annotations

import os

from measure import shm_buffers


def segment(folder, port: int, rank: int, uid: int | None = None):
    uid = os.getuid() if uid is None else uid
    path = folder / f"{shm_buffers.PREFIX}{uid}_127.0.0.1_{port}_{rank}"
    path.write_bytes(b"x" * 10)
    return path


def test_a_launch_removes_its_own_segments_only(tmp_path, monkeypatch):
    monkeypatch.setattr(shm_buffers, "SHM_DIR", tmp_path)
    mine = [segment(tmp_path, 29501, r) for r in (0, 1)]
    other = segment(tmp_path, 29502, 0)
    foreign_user = segment(tmp_path, 29501, 0, uid=os.getuid() + 1)
    unrelated = tmp_path / "torch_shm_29501_0"
    unrelated.write_bytes(b"")
    assert shm_buffers.remove_segments(29501) == 20
    assert not any(p.exists() for p in mine)
    assert other.exists() and foreign_user.exists() and unrelated.exists()
    assert shm_buffers.remove_segments(29501) == 0  # nothing left to remove, no error


def test_a_block_removes_the_segments_it_made(tmp_path, monkeypatch):
    monkeypatch.setattr(shm_buffers, "SHM_DIR", tmp_path)
    old = segment(tmp_path, 40000, 0)
    with shm_buffers.removing_new_segments():
        new = [segment(tmp_path, 40001, r) for r in (0, 1)]
    assert old.exists() and not any(p.exists() for p in new)


def test_no_shm_folder_is_no_segment(tmp_path, monkeypatch):
    monkeypatch.setattr(shm_buffers, "SHM_DIR", tmp_path / "absent")
    assert shm_buffers.launch_segments() == set() and shm_buffers.remove_segments(1) == 0
