"""Node start-up keeps freed heap (glibc M_TOP_PAD): the setting is read from
FERRY_MALLOC_TOP_PAD, a bad value is reported and ignored, never fatal; and large
read chunks are not mmapped afresh each time (M_MMAP_THRESHOLD)."""
from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest

from node import process


@pytest.mark.parametrize("value", ["lots", "1.5e3", ""])
def test_bad_top_pad_is_reported_and_ignored(monkeypatch, caplog, value: str) -> None:
    monkeypatch.setenv("FERRY_MALLOC_TOP_PAD", value)
    with caplog.at_level(logging.WARNING, logger="t"):
        process._tune_malloc(logging.getLogger("t"))
    assert "FERRY_MALLOC_TOP_PAD" in caplog.text and "ignored" in caplog.text


@pytest.mark.parametrize("value", ["0", "-5", str(64 << 20), str(1 << 40)])
def test_top_pad_values_apply_or_leave_glibc_default_quietly(monkeypatch, caplog, value: str) -> None:
    calls: list[tuple[int, int]] = []

    class Libc:
        @staticmethod
        def mallopt(param: int, val: int) -> int:
            calls.append((param, val))
            return 1
    monkeypatch.setenv("FERRY_MALLOC_TOP_PAD", value)
    monkeypatch.setattr("ctypes.CDLL", lambda name: Libc)
    with caplog.at_level(logging.WARNING, logger="t"):
        process._tune_malloc(logging.getLogger("t"))
    assert caplog.text == ""
    if int(value) <= 0:
        assert calls == []                       # glibc's default kept
    else:
        assert calls == [(process.M_TOP_PAD, min(int(value), 1 << 30)),
                         (process.M_MMAP_THRESHOLD, process.MMAP_THRESHOLD)]


def test_real_glibc_accepts_the_default(caplog) -> None:
    """On this (glibc) machine the real call succeeds: no warning."""
    with caplog.at_level(logging.WARNING, logger="t"):
        process._tune_malloc(logging.getLogger("t"))
    assert "refused" not in caplog.text


_FAULTS = textwrap.dedent("""
    import logging, os, resource, sys
    from node import process
    if sys.argv[1] == "tuned":
        process._tune_malloc(logging.getLogger("t"))
    fd = os.open(sys.argv[2], os.O_RDONLY)
    os.pread(fd, 2 << 20, 0)                  # the first chunk may fault its pages in
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(32):
        chunk = os.pread(fd, 2 << 20, 0)      # a page decoder's read chunk
        del chunk
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc tuning is Linux-only")
def test_read_chunks_reuse_heap_memory_instead_of_faulting_each_time(tmp_path, py_env) -> None:
    """A 2 MiB pread repeated 32 times: page faults stay about one chunk's worth, not a
    fault per page per chunk (32 x 512 = 16384) as when M_TOP_PAD alone turned off
    glibc's dynamic mmap threshold (the regression this guards)."""
    path = tmp_path / "chunk.bin"
    path.write_bytes(b"\x5a" * (2 << 20))

    def faults(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", _FAULTS, mode, str(path)], env=py_env,
                             capture_output=True, text=True, check=True)
        return int(out.stdout.strip())
    tuned = faults("tuned")
    assert tuned < 2048, f"{tuned} page faults for 32 reads of 2 MiB after tuning"
