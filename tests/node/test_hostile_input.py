"""Hostile input to the node: bad settings, bad flags, data
dirs that cannot be used, damaged files in a data dir, plans that try to exhaust the
node, requests that cannot fit a frame. Each case must end in ONE line that says what
is wrong, where and what to do (exit status 2 for a process), never a traceback, a
hang or a silent acceptance.

The data-dir cases run real ``python -m ferry node start`` processes on a copy of a
data dir a real node wrote; they all fail before the node reaches the control plane.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from node import Client
from node.config import load
from node.errors import ConfigError, TooLarge

from nodeharness import NodeProc, env, free_port, write_secret

# A node whose start fails before it contacts the control plane never dials this; one
# that wrongly got further would wait for it and hit the test's timeout.
NOWHERE = "http://127.0.0.1:9"
BASE = 'id = "n1"\ndata = "d"\n'


def node_start(args: list[str | bytes], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([sys.executable, "-m", "ferry", "node", "start", *args],
                              capture_output=True, text=True, env=env(), timeout=timeout,
                              errors="replace")
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"node start did not fail within {timeout}s: {e.stderr!r}") from None


def assert_one_line_error(r: subprocess.CompletedProcess[str], needle: str) -> str:
    """Exit status 2; stderr without a traceback, whose error is one line with ``needle``."""
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith(("Error:", "ferry node start:"))]
    assert len(errors) == 1, r.stderr[-3000:]
    assert needle in errors[0], (needle, errors[0])
    return errors[0]


# -- settings (node/config.py validate) ------------------------------------------------
BAD_SETTINGS = [
    ("[checkpoint]\ninterval_s = 0\n", "checkpoint.interval_s"),
    ("[checkpoint]\ninterval_s = -1\n", "checkpoint.interval_s"),
    ("[checkpoint]\ninterval_s = nan\n", "checkpoint.interval_s"),
    ("[checkpoint]\nmemory_budget = -1\n", "checkpoint.memory_budget"),
    ("[checkpoint]\npage_size = 3000\n", "checkpoint.page_size"),      # not a power of two
    ("[checkpoint]\npage_size = 512\n", "checkpoint.page_size"),       # below the format's 1 KiB
    ("[checkpoint]\npage_size = 131072\n", "checkpoint.page_size"),    # above its 64 KiB
    ("[rebalance]\nreplay_rate_limit = -10\n", "rebalance.replay_rate_limit"),
    ("[rebalance]\nbatch = true\n", "rebalance.batch"),
    ('log_level = "LOUD"\n', "log_level"),
    ("log_level = 5\n", "log_level"),
    ("[limits]\nmax_key_bytes = 100000\n", "limits.max_key_bytes"),    # more than a page holds
    ("[limits]\nmax_value_bytes = 2000000\n", "limits.max_value_bytes"),  # more than a frame
    ('[transfer]\nrate_limit = "fast"\n', "transfer.rate_limit"),
    ('[transfer]\nconcurrency = "4"\n', "transfer.concurrency"),
    ("[transfer]\nconcurrency = 100000\n", "transfer.concurrency"),
    ("[rebalance]\nindex_workers = true\n", "rebalance.index_workers"),
    ("transfer = 5\n", "must be a table"),
    ('[[caches]]\nname = "a"\n[[caches.indexes]]\nname = "x"\nfield = "f"\n'
     '[[caches.indexes]]\nname = "x"\nfield = "g"\n', "'x' appear more than once"),
    ('[[caches]]\nname = "a"\n[[caches.indexes]]\nname = "x"\nfield = "f"\nunique = "no"\n',
     "unique must be true or false"),
]


@pytest.mark.parametrize("text, needle", BAD_SETTINGS, ids=[b[0].strip() for b in BAD_SETTINGS])
def test_bad_settings_are_refused_naming_the_key(tmp_path, text, needle):
    f = tmp_path / "node.toml"
    f.write_text(BASE + text)
    with pytest.raises(ConfigError) as err:
        load(str(f))
    msg = str(err.value)
    assert needle in msg and str(f) in msg and "\n" not in msg, msg


def test_a_config_file_that_is_not_utf8_is_refused(tmp_path):
    f = tmp_path / "node.toml"
    f.write_bytes(BASE.encode() + b'log_level = "\xff"\n')
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(byte 0xff on line 3\)"):
        load(str(f))


@pytest.mark.parametrize("name, raw", [
    ("checkpoint.interval_s", "0"), ("checkpoint.interval_s", "-1"),
    ("rebalance.replay_rate_limit", "-10"), ("transfer.concurrency", "100000"),
])
def test_live_settings_get_the_same_range_checks(name, raw):
    """``ferry cluster settings set`` checks a value with validate() too."""
    from node.settings import parse
    with pytest.raises(ConfigError, match=name):
        parse(name, raw)


def test_good_settings_still_load(tmp_path):
    f = tmp_path / "node.toml"
    f.write_text(BASE + '[checkpoint]\ninterval_s = 0.5\npage_size = 8192\nmemory_budget = 1048576\n'
                 '[limits]\nmax_key_bytes = 900\nmax_value_bytes = 900000\n'
                 '[[caches]]\nname = "a"\n[[caches.indexes]]\nname = "x"\nfield = "f"\nunique = true\n'
                 '[[caches.indexes]]\nname = "y"\nfield = "f"\n')
    cfg = load(str(f), log_level="debug")
    assert (cfg.checkpoint_interval_s, cfg.page_size, cfg.max_value_bytes) == (0.5, 8192, 900000)


def test_small_pages_lower_the_default_key_limit(tmp_path):
    """A 1 KiB page holds keys of at most 483 bytes: that is the default there, not an
    error for a limit nobody set; setting more is refused."""
    f = tmp_path / "node.toml"
    f.write_text(BASE + "[checkpoint]\npage_size = 1024\n")
    assert load(str(f)).max_key_bytes == 483
    f.write_text(BASE + "[checkpoint]\npage_size = 1024\n[limits]\nmax_key_bytes = 512\n")
    with pytest.raises(ConfigError, match=r"max_key_bytes must be a whole number 1..483"):
        load(str(f))


def test_value_limit_fits_the_frame():
    from node.config import MAX_FRAME
    from transfer.frames import MAX_PAYLOAD
    assert MAX_FRAME == MAX_PAYLOAD


# -- `ferry node start`: flags and config files ----------------------------------------
@pytest.mark.parametrize("extra, needle", [
    (["--partitions", "0"], "partitions must be a whole number 1..65536, not 0"),
    (["--partitions", "-5"], "not -5"),
    (["--backups", "100"], "backups must be a whole number 0..8, not 100"),
    (["--log-level", "LOUD"], "log_level"),
])
def test_bad_flags_exit_2_with_one_line(tmp_path, extra, needle):
    secret = write_secret(str(tmp_path / "secret"))
    r = node_start(["--id", "n1", "--data", str(tmp_path / "d"), "--secret-file", secret,
                    "--control-plane", NOWHERE, *extra], timeout=30)
    assert_one_line_error(r, needle)


@pytest.mark.parametrize("content, needle", [
    (b'[transfer]\nrate_limit = "fast"\n', "transfer.rate_limit"),
    (b'[transfer]\nconcurrency = "4"\n', "transfer.concurrency"),
    (b"log_level = 5\n", "log_level"),
    (b"[checkpoint]\npage_size = 3000\n", "checkpoint.page_size"),
    (b"[checkpoint]\ninterval_s = 0\n", "checkpoint.interval_s"),
    (b'log_level = "\xff"\n', "not UTF-8"),
    (b'[[caches]]\nname = "a"\n[[caches.indexes]]\nname = "x"\nfield = "f"\n'
     b'[[caches.indexes]]\nname = "x"\nfield = "g"\n', "more than once"),
], ids=["rate_limit-text", "concurrency-text", "log_level-int", "page_size", "interval-0",
        "not-utf8", "duplicate-index"])
def test_bad_config_files_exit_2_with_one_line(tmp_path, content, needle):
    secret = write_secret(str(tmp_path / "secret"))
    cfg = tmp_path / "node.toml"
    cfg.write_bytes(content)
    r = node_start(["--config", str(cfg), "--id", "n1", "--data", str(tmp_path / "d"),
                    "--secret-file", secret, "--control-plane", NOWHERE], timeout=30)
    line = assert_one_line_error(r, needle)
    assert str(cfg) in line


@pytest.mark.parametrize("kind", ["fifo", "2MB"])
def test_a_config_that_is_not_a_small_file_is_refused_unread(tmp_path, kind):
    """A FIFO blocked the start for ever; a huge file was read whole."""
    secret = write_secret(str(tmp_path / "secret"))
    cfg = tmp_path / "node.toml"
    if kind == "fifo":
        os.mkfifo(cfg)
    else:
        cfg.write_bytes(b"# " + b"x" * (2 << 20) + b"\n")
    r = node_start(["--config", str(cfg), "--id", "n1", "--data", str(tmp_path / "d"),
                    "--secret-file", secret, "--control-plane", NOWHERE], timeout=30)
    assert_one_line_error(r, "not a regular file" if kind == "fifo" else "bytes; a node's config")


# -- `ferry node start --data` that cannot be used --------------------------------------
def _symlink_loop(tmp_path):
    os.symlink(tmp_path / "loop-b", tmp_path / "loop-a")
    os.symlink(tmp_path / "loop-a", tmp_path / "loop-b")
    return str(tmp_path / "loop-a")


def _unwritable(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes into a mode-555 directory: test_an_unwritable_data_dir_as_another_user")
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    return str(d / "data")


def _read_only_mount(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a read-only tmpfs needs root")
    d = tmp_path / "romnt"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(d)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    return str(d)


HOSTILE_DIRS = [
    ("proc", lambda t: "/proc", "pseudo file system"),
    ("proc-self", lambda t: "/proc/self", "pseudo file system"),
    ("dev-null", lambda t: "/dev/null", "is a character device, not a directory"),
    ("symlink-loop", _symlink_loop, "loop of symbolic links"),
    ("read-only-mount", _read_only_mount, "read-only"),
    ("unwritable-dir", _unwritable, "permission denied"),
]


@pytest.mark.parametrize("make, needle", [h[1:] for h in HOSTILE_DIRS], ids=[h[0] for h in HOSTILE_DIRS])
def test_unusable_data_dirs_exit_2_with_one_line(tmp_path, make, needle):
    secret = write_secret(str(tmp_path / "secret"))
    data = make(tmp_path)
    try:
        r = node_start(["--id", "n1", "--data", data, "--listen", f"127.0.0.1:{free_port()}",
                        "--secret-file", secret, "--control-plane", NOWHERE])
    finally:
        if os.path.ismount(data):
            subprocess.run(["umount", data], check=False)
    line = assert_one_line_error(r, needle)
    assert data in line


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="root runs the node as nobody here; other users run unwritable-dir")
def test_an_unwritable_data_dir_as_another_user(tmp_path):
    """Root may write anywhere: the node runs as nobody under a mode-555 directory."""
    import tempfile
    base = tempfile.mkdtemp(prefix="ferry-unwritable-", dir="/tmp")
    try:
        os.chmod(base, 0o555)
        for data in (os.path.join(base, "data"), base):        # to create / to write in
            r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                sys.executable, "-m", "ferry", "node", "start", "--id", "n1",
                                "--data", data, "--secret-file", "/nonexistent",
                                "--control-plane", NOWHERE],
                               capture_output=True, text=True, env=env(), cwd="/", timeout=60)
            line = assert_one_line_error(r, "permission denied")
            assert data in line
    finally:
        os.chmod(base, 0o755)
        shutil.rmtree(base)


# -- damaged files in a data dir a real node wrote -----------------------------------------
@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A data dir a real node wrote (4 partitions OWNING, an index, a WAL segment) and
    the etcd it registered with, kept running for the module."""
    from node.etcdserver import EtcdCluster
    root = tmp_path_factory.mktemp("written")
    etcd = EtcdCluster(str(root / "etcd")).start()
    secret = write_secret(str(root / "secret"))
    cfg = root / "node.toml"
    cfg.write_text('[[caches]]\nname = "default"\npartitions = 4\nbackups = 0\n'
                   '[[caches.indexes]]\nname = "by_city"\nfield = "city"\n')
    n = NodeProc(str(root), "n1", secret, control_plane=etcd.endpoints, config=str(cfg))
    try:
        n.start()
        with Client([n.address], secret_file=secret) as c:
            for i in range(20):
                c.put("default", f"k{i}", '{"city": "oslo"}')
        assert n.stop() == 0
        yield SimpleNamespace(data=n.data, secret=secret, config=str(cfg), etcd=etcd)
    finally:
        n.kill()
        etcd.stop()


def _write(rel: str, content: bytes):
    def damage(d: str) -> None:
        with open(os.path.join(d, rel), "wb") as f:
            f.write(content)
    return damage


def _replace(rel: str, make):
    """The file ``rel`` replaced by what ``make`` creates (os.mkdir, os.mkfifo)."""
    def damage(d: str) -> None:
        p = os.path.join(d, rel)
        os.unlink(p)
        make(p)
    return damage


def _remove(rel: str):
    return lambda d: os.unlink(os.path.join(d, rel))


def _flip(rel: str, offset: int):
    def damage(d: str) -> None:
        with open(os.path.join(d, rel), "r+b") as f:
            f.seek(offset)
            b = f.read(1)
            f.seek(offset)
            f.write(bytes([b[0] ^ 0xFF]))
    return damage


def _segment(d: str) -> str:
    wal = os.path.join(d, "caches", "default", "wal")
    return os.path.join(wal, sorted(n for n in os.listdir(wal) if n.endswith(".wal"))[0])


def _rename_segment(new_name: str):
    def damage(d: str) -> None:
        seg = _segment(d)
        os.rename(seg, os.path.join(os.path.dirname(seg), new_name))
    return damage


def _segment_is_dir(d: str) -> None:
    seg = _segment(d)
    os.unlink(seg)
    os.mkdir(seg)


def _wal_is_file(d: str) -> None:
    wal = os.path.join(d, "caches", "default", "wal")
    shutil.rmtree(wal)
    open(wal, "wb").close()


def _cache_dir_is_file(d: str) -> None:
    shutil.rmtree(os.path.join(d, "caches", "default"))
    open(os.path.join(d, "caches", "default"), "wb").close()


PART = "caches/default/part-1.bin"
DAMAGE = [
    ("states-not-an-object", _write("states.json", b"[1, 2]"), "states.json"),
    ("states-bad-partition", _write("states.json", b'{"caches": {"default": {"x": "OWNING"}}}'),
     "is not PARTITION: STATE"),
    ("states-bad-state", _write("states.json", b'{"caches": {"default": {"0": "BOGUS"}}}'),
     "'BOGUS'"),
    ("states-fifo", _replace("states.json", os.mkfifo), "not a regular file"),
    ("node-id-not-utf8", _write("node.id", b"n\xff1\n"), "node.id is not UTF-8 text"),
    ("node-id-dir", _replace("node.id", os.mkdir), "node.id is a directory"),
    ("partition-crc", _flip(PART, 100), "part-1.bin is corrupt at page 0"),
    ("partition-empty", _write(PART, b""), "part-1.bin is corrupt"),
    ("partition-truncated", _write(PART, b"FERRY"), "part-1.bin is corrupt"),
    ("partition-dir", _replace(PART, os.mkdir), "part-1.bin: a directory where a file belongs"),
    ("partition-missing", _remove(PART), "part-1.bin is missing"),
    ("segment-renamed", _rename_segment("garbage.wal"), "garbage.wal"),
    ("segment-renumbered", _rename_segment("0000000000000005-0000000000000001.wal"),
     "the file name says 5"),
    ("segment-dir", _segment_is_dir, "is a directory, not a write-ahead log segment"),
    ("wal-is-a-file", _wal_is_file, "wal: exists but is not a directory"),
    ("cache-dir-is-a-file", _cache_dir_is_file, "not a directory"),
    ("index-garbage", _write("indexes/default/data.mdb", os.urandom(20000)),
     "data.mdb is corrupt; the indexes hold no data of their own: delete"),
    ("index-dir", _replace("indexes/default/data.mdb", os.mkdir), "data.mdb is corrupt"),
]


@pytest.mark.parametrize("damage, needle", [d[1:] for d in DAMAGE], ids=[d[0] for d in DAMAGE])
def test_damaged_data_dir_exits_2_with_one_line(written, tmp_path, damage, needle):
    data = str(tmp_path / "n1")
    shutil.copytree(written.data, data, symlinks=True)
    damage(data)
    r = node_start(["--config", written.config, "--id", "n1", "--data", data,
                    "--listen", f"127.0.0.1:{free_port()}", "--secret-file", written.secret,
                    "--control-plane", NOWHERE], timeout=30)
    line = assert_one_line_error(r, needle)
    assert line.startswith("ferry node start: node n1 cannot start: ")


def test_a_garbage_index_goes_away_as_the_message_says(written, tmp_path):
    """Follow the advice: delete the index dir; the node rebuilds it and serves."""
    data = str(tmp_path / "n1")
    shutil.copytree(written.data, data, symlinks=True)
    _write("indexes/default/data.mdb", os.urandom(20000))(data)
    n = NodeProc(str(tmp_path), "n1", written.secret, control_plane=written.etcd.endpoints,
                 config=written.config)
    r = node_start(n.args()[5:], timeout=30)
    assert_one_line_error(r, "delete " + os.path.join(data, "indexes", "default"))
    shutil.rmtree(os.path.join(data, "indexes", "default"))
    try:
        n.start()
        with Client([n.address], secret_file=written.secret) as c:
            assert c.lookup("default", "by_city", "oslo") == sorted(f"k{i}".encode() for i in range(20))
    finally:
        n.stop()


# -- the client and `ferry cluster` ------------------------------------------------------------
@pytest.fixture
def one(tmp_path, nodes):
    secret = write_secret(str(tmp_path / "secret"))
    n = NodeProc(str(tmp_path), "n1", secret, partitions=4, backups=0)
    nodes.append(n)
    n.start()
    yield n
    n.stop()


def test_a_value_over_the_frame_is_too_large_at_once(one):
    with Client([one.address], secret_file=one.secret, timeout=10) as c:
        for call in (lambda: c.put("default", b"k", b"v" * (2 << 20)),
                     lambda: c.put_many("default", [(b"k", b"v" * (2 << 20))])):
            t0 = time.monotonic()
            with pytest.raises(TooLarge, match="nothing was sent"):
                call()
            assert time.monotonic() - t0 < 1.0
        c.put("default", b"k", b"v")            # the connection is still fine
        assert c.get("default", b"k") == b"v"


@pytest.mark.parametrize("args", [
    ["put", b"k\xff", "v"], ["put", "k", b"v\xff"], ["get", b"\xffk"], ["remove", b"k\xfe"],
    ["put", "--cache", b"c\xff", "k", "v"], ["leave", b"n\xff"],
], ids=["put-key", "put-value", "get", "remove", "cache", "leave"])
def test_cluster_commands_refuse_non_utf8_arguments(one, args):
    r = subprocess.run([sys.executable, "-m", "ferry", "cluster", args[0], "--seed", one.address,
                        "--secret-file", one.secret, *args[1:]], capture_output=True, text=True,
                       env=env(), timeout=60, errors="replace")
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "not UTF-8 text (byte 0x" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


# -- a cluster record in etcd (P/meta) that is garbage -------------------------------------
@pytest.mark.parametrize("meta, needle", [
    ({"caches": "default", "created_by": "n0"}, "caches must be a non-empty list, not a string"),
    ([1, 2], "must be a JSON object, not a list"),
    ({"caches": [{"name": "default", "partitions": "4", "backups": 0}]}, "partitions must be a whole number"),
    ({"caches": [{"name": "default", "partitions": 4, "backups": 0}], "initial_members": "n1"},
     "initial_members must be a list"),
    (b"{not json", "not JSON"),
], ids=["caches-string", "a-list", "partitions-string", "initial-members-string", "not-json"])
def test_a_garbage_cluster_record_refuses_the_start_with_one_line(tmp_path, meta, needle):
    import base64

    from nodeharness import control_plane
    from node.control import Etcd
    endpoints = control_plane()
    e = Etcd(endpoints)
    if isinstance(meta, bytes):
        e.post("/kv/put", {"key": base64.b64encode(b"/ferry/default/meta").decode(),
                           "value": base64.b64encode(meta).decode()})
    else:
        e.put("/ferry/default/meta", meta)
    secret = write_secret(str(tmp_path / "secret"))
    r = node_start(["--id", "n1", "--data", str(tmp_path / "d"), "--listen", f"127.0.0.1:{free_port()}",
                    "--secret-file", secret, "--control-plane", ",".join(endpoints),
                    "--partitions", "4", "--backups", "0"], timeout=60)
    line = assert_one_line_error(r, needle)
    assert "/ferry/default/meta" in line and "revision" in line, line
