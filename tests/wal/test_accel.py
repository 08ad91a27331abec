"""The C accelerator of the append path (``wal/_accel.c``) against the pure-Python path.

Both must write byte-identical segment files; the C CRC32C (hardware and table) must
equal the ``crc32c`` package's; a short write / full disk through the C path must end
exactly as on the Python path; ``FERRY_WAL_ACCEL=0`` and fault-injecting file layers
must turn it off.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import tempfile
from typing import Iterator

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from faults import fileio
from faults.powerloss import PowerLossLayer
from wal import OutOfDiskError, Wal, accel

_accel = accel._accel
needs_accel = pytest.mark.skipif(_accel is None, reason="wal._accel was not built "
                                  "(no C compiler or Python headers on this machine)")


@contextlib.contextmanager
def accel_env(on: bool) -> Iterator[None]:
    old = os.environ.get(accel.ENV)
    os.environ[accel.ENV] = "1" if on else "0"
    try:
        yield
    finally:
        if old is None:
            del os.environ[accel.ENV]
        else:
            os.environ[accel.ENV] = old


@contextlib.contextmanager
def hardware_crc(on: bool) -> Iterator[None]:
    was = _accel.hardware()
    _accel._set_hardware(on)
    try:
        yield
    finally:
        _accel._set_hardware(was)


# Sizes around the C path's thresholds: copy vs writev (8192), GIL released (frame of
# 65536), and the CRC's three-stream blocks (3 x 256, 3 x 8192).
EDGE_SIZES = [0, 1, 7, 8, 9, 100, 767, 768, 769, 1024, 1025, 4076, 8191, 8192, 8193,
              24575, 24576, 24577, 65515, 65516, 65517, 70_000]
sizes = st.one_of(st.integers(0, 300), st.integers(0, 70_000), st.sampled_from(EDGE_SIZES))
kinds = st.sampled_from(["bytes", "bytearray", "memoryview"])
ops = st.lists(st.one_of(
    st.tuples(st.just("append"), sizes, kinds, st.integers(0, 0xFFFF), st.booleans()),
    st.tuples(st.just("many"), st.lists(st.integers(0, 3000), min_size=0, max_size=5)),
    st.tuples(st.just("sync")),
), min_size=1, max_size=25)


def _payload(rng: random.Random, size: int, kind: str) -> bytes | bytearray | memoryview:
    raw = rng.randbytes(size + 3)
    if kind == "bytearray":
        return bytearray(raw[3:])
    if kind == "memoryview":
        return memoryview(raw)[3:]         # a slice: not at the start of its buffer
    return raw[3:]


def _run(d: str, script: list, seed: int, segment_size: int, mode: str) -> dict[str, bytes]:
    rng = random.Random(seed)
    w = Wal.open(d, segment_size=segment_size, sync=mode)
    expected = []
    try:
        for op in script:
            if op[0] == "append":
                _, size, kind, type_, wait = op
                p = _payload(rng, size, kind)
                w.append(p, type_, wait=wait and mode != "group")
                expected.append(bytes(p))
            elif op[0] == "many":
                ps = [rng.randbytes(s) for s in op[1]]
                w.append_many(ps, wait=False)
                expected.extend(ps)
            else:
                w.sync()
        assert [r.payload for r in w.read_from()] == expected
    finally:
        w.close()
    return {name: open(os.path.join(d, name), "rb").read() for name in sorted(os.listdir(d))
            if name.endswith(".wal")}


def _both(script: list, seed: int, segment_size: int, mode: str) -> tuple[dict, dict]:
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        with accel_env(False):
            pure = _run(a, script, seed, segment_size, mode)
        with accel_env(True):
            fast = _run(b, script, seed, segment_size, mode)
    return pure, fast


@needs_accel
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=ops, seed=st.integers(0, 2**32), segment_size=st.sampled_from(
    [4096, 16384, 1 << 20]), mode=st.sampled_from(["none", "group"]))
def test_accelerated_and_pure_paths_write_identical_segments(script, seed, segment_size,
                                                              mode) -> None:
    pure, fast = _both(script, seed, segment_size, mode)
    assert list(pure) == list(fast)
    for name in pure:
        assert pure[name] == fast[name], name


@needs_accel
def test_table_crc_writes_identical_segments_too() -> None:
    script = [("append", s, k, s % 7, True) for s in EDGE_SIZES
              for k in ("bytes", "memoryview")] + [("many", [3, 0, 9])] + \
             [("append", 50, "bytearray", 1, False)]
    with hardware_crc(False):
        assert not _accel.hardware()
        pure, fast = _both(script, 7, 16384, "none")
    assert len(pure) > 2 and pure == fast


@needs_accel
@pytest.mark.parametrize("hw", [True, False], ids=["sse4.2", "table"])
def test_crc_matches_the_crc32c_package_on_edge_sizes(hw: bool) -> None:
    if hw and not _accel._set_hardware(True):
        pytest.skip("the CPU has no SSE4.2")
    rng = random.Random(1)
    with hardware_crc(hw):
        assert _accel.hardware() == hw
        for size in EDGE_SIZES + [3 * 8192 * 2 + 5, 100_003]:
            for offset in (0, 1, 5):          # unaligned starts
                data = rng.randbytes(size + offset)[offset:]
                seed = rng.getrandbits(32)
                assert _accel.crc32c(data, seed) == crc32c(data, seed), (size, offset)
                assert _accel.crc32c(memoryview(data)) == crc32c(data)


@needs_accel
@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=70_000), seed=st.integers(0, 2**32 - 1), hw=st.booleans())
def test_crc_matches_the_crc32c_package(data: bytes, seed: int, hw: bool) -> None:
    with hardware_crc(hw):
        assert _accel.crc32c(data, seed) == crc32c(data, seed)


@needs_accel
def test_bad_type_raises_before_anything_is_written(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(accel.ENV, "1")      # also when the suite runs with it off
    w = Wal.open(tmp_path, sync="none")
    assert w._frame_write is not None
    w.append(b"one")
    size = w._seg.size
    for bad in (-1, 0x10000, 2**70):
        with pytest.raises(ValueError, match="record type must be in 0..65535"):
            w.append(b"x", bad)
    with pytest.raises(TypeError):
        w.append(b"x", "3")
    with pytest.raises(TypeError):
        w.append("not bytes")
    assert w._seg.size == size and w.last_lsn == 1
    w.append(b"two", 0xFFFF)
    w.close()
    assert [(r.payload, r.type) for r in Wal.reader(tmp_path).read_from()] == \
        [(b"one", 0), (b"two", 0xFFFF)]


def test_env_and_fault_layers_turn_the_accelerator_off(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(accel.ENV, "0")
    assert accel.status() in ("python-disabled", "python-not-built")
    w = Wal.open(tmp_path / "a", sync="none")
    assert w._frame_write is None
    w.append(b"pure")
    w.close()
    monkeypatch.delenv(accel.ENV)
    if _accel is not None:
        assert accel.status() in ("c-sse4.2", "c-table")
        w = Wal.open(tmp_path / "b", sync="none")
        assert w._frame_write is _accel.frame_write
        w.close()
    # A fault-injecting layer must see every write: the C path is never used under it.
    with fileio.use(PowerLossLayer(keep_unsynced=1.0, seed=1)):
        w = Wal.open(tmp_path / "c", sync="none")
        assert w._frame_write is None
        w.append(b"through the layer")
        w.close()


def test_pure_path_runs_when_the_module_is_missing(tmp_path, py_env, python) -> None:
    """A machine without a compiler: importing wal with no _accel leaves the Python path."""
    code = ("import sys; sys.modules['wal._accel'] = None\n"
            "from wal import Wal, accel\n"
            "assert accel._accel is None and accel.status() == 'python-not-built'\n"
            f"w = Wal.open({str(tmp_path)!r}, sync='none')\n"
            "assert w._frame_write is None\n"
            "w.append(b'x' * 5000); w.append(b'y'); w.close()\n"
            f"print([len(r.payload) for r in Wal.reader({str(tmp_path)!r}).read_from()])\n")
    r = subprocess.run([python, "-c", code], env=py_env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[5000, 1]"


@needs_accel
@pytest.mark.parametrize("size,mode", [(900, "none"), (5000, "none"), (20_000, "none"),
                                       (20_000, "always"), (70_000, "none")])
def test_disk_full_through_the_c_path(small_fs, monkeypatch, size: int, mode: str) -> None:
    """Frames of 900 B and 5000 B (copied next to the head), 20 kB (writev, which tmpfs
    cuts short at the last free page) and 70 kB (writev without the GIL): the failing
    append raises OutOfDiskError, and the log holds exactly the acknowledged records,
    before and after reopening."""
    monkeypatch.setenv(accel.ENV, "1")
    d = small_fs / "log"
    w = Wal.open(d, segment_size=256 << 10, sync=mode)
    assert w._frame_write is not None
    rng = random.Random(size)
    acked: list[bytes] = []
    with pytest.raises(OutOfDiskError) as ei:
        while True:
            p = rng.randbytes(size)
            w.append(p, len(acked) % 3)
            acked.append(p)
    assert ei.value.path.startswith(str(d))
    assert len(acked) > 5 and w.last_lsn == len(acked)
    assert [r.payload for r in w.read_from()] == acked
    w.close()
    w = Wal.open(d, segment_size=256 << 10, sync=mode)
    assert [r.payload for r in w.read_from()] == acked
    w.truncate_before(w.last_lsn)
    w.append(b"room again")
    w.close()
    assert [r.payload for r in Wal.reader(d).read_from()][-1] == b"room again"


@needs_accel
@pytest.mark.parametrize("cap", [1, 10, 20, 1000, 4100, 9000, 66_000])
def test_short_writes_are_finished_by_python(cap: int) -> None:
    """Every frame write cut short (the test hook; the tmpfs test below does it for
    real): append hands the rest to Python's _write, and the files equal those of
    the pure path."""
    script = [("append", s, "bytes", 3, True) for s in (0, 10, 1000, 5000, 20_000, 70_000)] + \
        [("append", 9, "memoryview", 1, False), ("many", [5, 6])] + \
        [("append", s, "bytearray", 2, True) for s in (4076, 8193)]
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        with accel_env(False):
            pure = _run(a, script, 5, 1 << 20, "none")
        os.environ[accel.ENV] = "1"
        _accel._set_write_cap(cap)
        try:
            cut = _run(b, script, 5, 1 << 20, "none")
        finally:
            _accel._set_write_cap(0)
            del os.environ[accel.ENV]
    assert pure == cut


def test_env_switch_in_a_child_process(python, py_env, tmp_path) -> None:
    """FERRY_WAL_ACCEL=0 as a user sets it: in the environment of a fresh process."""
    code = ("from wal import Wal, accel\n"
            f"w = Wal.open({str(tmp_path)!r}, sync='none')\n"
            "print(accel.status(), w._frame_write is not None); w.close()\n")
    out = {}
    for value in ("0", "1"):
        r = subprocess.run([python, "-c", code], env={**py_env, accel.ENV: value},
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        out[value] = r.stdout.split()
    assert out["0"] == ["python-disabled", "False"]
    if _accel is not None:
        assert out["1"][0] in ("c-sse4.2", "c-table") and out["1"][1] == "True"


def test_verify_json_names_the_append_path(tmp_path, python, py_env) -> None:
    Wal.open(tmp_path, sync="none").close()
    out = {}
    for value in ("0", "1"):
        r = subprocess.run([python, "-m", "ferry", "wal", "verify", "--json",
                            str(tmp_path)], env={**py_env, accel.ENV: value},
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        out[value] = json.loads(r.stdout)["append_path"]
    assert out["0"] == "python-disabled"
    assert out["1"] == accel.status() if _accel is None else out["1"].startswith("c-")


def _full_pipe() -> tuple[int, int]:
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        while True:
            os.write(w, bytes(65536))
    except BlockingIOError:
        pass
    os.set_blocking(w, True)
    return r, w


@needs_accel
@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs signal.setitimer")
def test_eintr_runs_signal_handlers_like_os_write() -> None:
    """A write interrupted by a signal (EINTR): the handler runs; if it raises, the
    exception comes out and nothing was written (append then changes no state); if
    not, the write is retried, as os.write does (PEP 475)."""
    class Stop(Exception):
        pass

    r, w = _full_pipe()
    old = signal.getsignal(signal.SIGALRM)
    try:
        def stop(signum, frame):
            raise Stop()
        signal.signal(signal.SIGALRM, stop)
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with pytest.raises(Stop):
            _accel.frame_write(w, b"x" * 100, 0, 1, 0, -1)

        drained = []

        def drain(signum, frame):          # makes room, does not raise: write retried
            drained.append(len(os.read(r, 1 << 20)))
        signal.signal(signal.SIGALRM, drain)
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        v, m, n = _accel.frame_write(w, b"y" * 100, 0, 1, 0, -1)
        assert n == 120 and drained
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            assert (v, m) == _accel.frame_write(null, b"y" * 100, 0, 1, 0, -1)[:2]
        finally:
            os.close(null)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        os.close(r)
        os.close(w)


@pytest.mark.parametrize("on", [True, False], ids=["c", "python"])
@pytest.mark.parametrize("size", [10, 2000])
def test_wide_item_buffers_are_refused_not_mis_framed(tmp_path, monkeypatch, on: bool,
                                                      size: int) -> None:
    """len() of a memoryview of 4-byte items counts items, not bytes: the frame's length
    would lie. Both paths refuse it before writing; a cast('B') view is fine."""
    from array import array
    monkeypatch.setenv(accel.ENV, "1" if on else "0")
    w = Wal.open(tmp_path, sync="none")
    wide = memoryview(array("i", range(size)))
    with pytest.raises(ValueError, match="1-byte items"):
        w.append(wide)
    assert w.last_lsn == 0
    w.append(wide.cast("B"))
    w.close()
    assert [r.payload for r in Wal.reader(tmp_path).read_from()] == [wide.tobytes()]


@needs_accel
@settings(max_examples=300, deadline=None)
@given(payload=st.binary(max_size=64), chain=st.integers(0, 0xFFFFFFFF),
       prev_check=st.one_of(st.just(-1), st.integers(0, 0xFFFFFFFF)))
def test_the_c_frame_path_mixes_like_format_mix(payload: bytes, chain: int,
                                                prev_check: int) -> None:
    """wal/_accel.c keeps its own copy of the check's mix; the Python one lives only in
    wal/format.py (mix). A frame's check from C is format.mix of its chain value, and
    that chain value is the CRC the Python path computes."""
    from wal.format import CHECK_HEAD, HEAD, mix, unmix
    fd = os.open(os.devnull, os.O_WRONLY)
    try:
        v, m, written = _accel.frame_write(fd, payload, 3, 7, chain, prev_check)
    finally:
        os.close(fd)
    head = HEAD.pack(len(payload), 7, 3) if prev_check < 0 else \
        CHECK_HEAD.pack(prev_check, len(payload), 7, 3)
    assert v == crc32c(head + payload, chain)
    assert m == mix(v) and unmix(m) == v
