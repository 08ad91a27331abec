from __future__ import annotations

import os
import uuid

import pytest

from checkpoint import PartitionStore
from tests.tmpfs import mounted


@pytest.fixture
def open_store(tmp_path):
    """Open stores in tmp_path/store; all are closed at the end of the test."""
    opened: list[PartitionStore] = []

    def _open(**kw) -> PartitionStore:
        kw.setdefault("checkpoint_interval", None)
        kw.setdefault("wal_sync", "none")
        s = PartitionStore.open(str(tmp_path / "store"), **kw)
        opened.append(s)
        return s

    yield _open
    for s in opened:
        if not s._closed:
            s.close(checkpoint=False)


def part_file(tmp_path, p: int) -> str:
    return os.path.join(str(tmp_path / "store"), f"part-{p}.bin")


# -- the page decoder both ways ---------------------------------------------------------
# The decoder's own tests run twice: with the C accelerator (checkpoint/_pageaccel.c) and
# with the pure-Python path, which must give identical results (test_pageaccel.py
# compares the two directly). The other modules run
# with whatever the environment selects (FERRY_PAGE_ACCEL=0 runs the whole suite pure).
DECODER_TESTS = {"test_pagefile.py", "test_pagefile_fast.py", "test_chains.py"}


@pytest.fixture(autouse=True)
def page_accel(request, monkeypatch):
    """"accel"/"pure" in the decoder tests (pure: switch.page set to None)."""
    mode = getattr(request, "param", None)
    if mode == "pure":
        from checkpoint import accel as switch
        monkeypatch.setattr(switch, "page", None)
    return mode


def pytest_generate_tests(metafunc) -> None:
    if "page_accel" not in metafunc.fixturenames:
        return
    if os.path.basename(str(metafunc.module.__file__)) not in DECODER_TESTS:
        return
    from checkpoint import accel as switch
    modes = ["pure"] + (["accel"] if switch.page is not None else [])
    metafunc.parametrize("page_accel", modes, indirect=True)


@pytest.fixture
def small_fs(tmp_path):
    """A real 8 MiB tmpfs (disk-full tests); skips where mounting is not permitted."""
    with mounted(tmp_path / f"tmpfs-{uuid.uuid4().hex[:6]}", 8) as mnt:
        yield mnt
