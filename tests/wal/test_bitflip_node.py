"""A flipped byte in an acknowledged value of zeros, one level below the node, is
corruption, never a torn tail to cut.

A child process opens a node's store as ``node/storage.py`` does
(``PartitionStore.open``, checkpoints an hour apart, group commit), creates 4
partitions, puts ``ack-0``, ``zeros`` (2000 zero bytes), ``ack-1`` .. ``ack-49`` (each
acknowledged: ``put`` returns after the group commit's fsync) and is killed with
SIGKILL. One byte inside the zero run of the ``zeros`` frame in the first segment of
the node WAL is flipped. ``ferry wal verify`` reports it as corruption (exit 1, not a
torn tail), and the store refuses to open rather than cut the log there (which would
drop ``zeros`` and ``ack-1`` .. ``ack-49``).
"""
from __future__ import annotations

import signal
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from checkpoint import PartitionStore
from checkpoint.records import RecordType
from wal import CorruptRecordError, verify
from wal.format import HEAD3, HEAD_SIZE, HEADER_SIZE, FRAME_OVERHEAD

PARTITIONS = 4
KEYS = [b"ack-0", b"zeros"] + [b"ack-%d" % i for i in range(1, 50)]

CHILD = r"""
import sys, time, zlib
from checkpoint import PartitionStore
s = PartitionStore.open(sys.argv[1], checkpoint_interval=3600, wal_sync="group")
for p in range(4):
    s.create_partition(p)
for key in sys.argv[2:]:
    k = key.encode()
    s.put(zlib.crc32(k) % 4, k, bytes(2000) if k == b"zeros" else b"value of " + k)
print("acknowledged", flush=True)
time.sleep(60)
"""


def value(key: bytes) -> bytes:
    return bytes(2000) if key == b"zeros" else b"value of " + key


def part(key: bytes) -> int:
    return zlib.crc32(key) % PARTITIONS


def run_and_kill(store: Path, py_env: dict[str, str], keys: list[bytes]) -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(store), *map(bytes.decode, keys)],
                             env=py_env, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "acknowledged"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)


def frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """(offset, lsn, type, payload) of the plain frames of an undamaged segment."""
    out, off = [], HEADER_SIZE
    while off + FRAME_OVERHEAD <= len(data):
        length, lsn, typ, _ = HEAD3.unpack_from(data, off)
        out.append((off, lsn, typ, data[off + HEAD_SIZE:off + HEAD_SIZE + length]))
        off += FRAME_OVERHEAD + length
    return out


def update_frame(seg: Path, key: bytes) -> tuple[int, int]:
    """(frame offset, offset of the value) of the UPDATE record that put ``key``."""
    data = seg.read_bytes()
    for off, _lsn, typ, payload in frames(data):
        # partition u32 | counter u64 | flags u8 | key_len u16 | key | value
        if typ == RecordType.UPDATE and payload[15:15 + len(key)] == key and \
                int.from_bytes(payload[13:15], "little") == len(key):
            return off, off + HEAD_SIZE + 15 + len(key)
    raise AssertionError(f"no UPDATE record of {key!r} in {seg}")


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def ferry_wal(py_env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ferry", "wal", *args], env=py_env,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def killed_store(tmp_path, py_env) -> tuple[Path, Path]:
    store = tmp_path / "caches" / "c"
    run_and_kill(store, py_env, KEYS)
    segs = sorted((store / "wal").glob("*.wal"))
    return store, segs[0]


def test_flip_in_a_zero_run_is_corruption_and_the_store_refuses_to_open(
        killed_store, py_env, tmp_path) -> None:
    store, seg = killed_store
    frame, val = update_frame(seg, b"zeros")
    flip(seg, val + 1000)
    wal_dir = store / "wal"

    rep = verify(str(wal_dir))
    assert not rep.ok and rep.torn is None
    assert rep.corruption[:2] == (str(seg), frame)
    r = ferry_wal(py_env, "verify", str(wal_dir))
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"CORRUPT: {seg} at offset {frame}" in r.stderr
    assert "torn" not in r.stdout

    with pytest.raises(CorruptRecordError) as ei:
        PartitionStore.open(str(store), checkpoint_interval=3600)
    msg = str(ei.value)
    assert (ei.value.path, ei.value.offset) == (str(seg), frame)
    assert str(seg) in msg and f"offset {frame}" in msg and "ferry wal repair" in msg
    assert seg.stat().st_size > frame + 49 * FRAME_OVERHEAD     # nothing was cut

    # A person decides: repair with a backup cuts the log at the damage. Every record
    # before it is kept; the backup holds the rest.
    backup = tmp_path / "wal-backup"
    r = ferry_wal(py_env, "repair", str(wal_dir), "--backup", str(backup))
    assert r.returncode == 0, r.stderr
    assert (backup / seg.name).stat().st_size > frame
    s = PartitionStore.open(str(store), checkpoint_interval=3600)
    try:
        assert s.get(part(b"ack-0"), b"ack-0") == value(b"ack-0")
        assert s.get(part(b"zeros"), b"zeros") is None
    finally:
        s.close()


def test_the_same_flip_without_a_zero_run_was_and_is_corruption(killed_store) -> None:
    store, seg = killed_store
    frame, val = update_frame(seg, b"ack-7")
    flip(seg, val + 3)
    rep = verify(str(store / "wal"))
    assert rep.corruption[:2] == (str(seg), frame)
    with pytest.raises(CorruptRecordError) as ei:
        PartitionStore.open(str(store), checkpoint_interval=3600)
    assert ei.value.offset == frame


def test_undamaged_the_store_keeps_every_acknowledged_write(killed_store) -> None:
    store, _ = killed_store
    assert verify(str(store / "wal")).ok
    s = PartitionStore.open(str(store), checkpoint_interval=3600)
    try:
        assert {k: s.get(part(k), k) for k in KEYS} == {k: value(k) for k in KEYS}
    finally:
        s.close()
