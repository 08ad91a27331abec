"""A copy whose data went back in time is never trusted: a node whose data directory
was restored from an old backup comes back with every copy RETURNING (unconfirmed).
It is taken out of the in-sync sets and joins again through its primary, which compares
counters; when every in-sync copy is back unconfirmed, the one at the highest counter
is elected. A read never returns the value the backup held after a newer one was
acknowledged (real node processes, SIGKILL, a real etcd)."""
from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from node import Client

from nodeharness import NodeProc, wait_settled, write_secret

PARTS = 8
TTL = 2
CONFIG = f"""
[control_plane]
lease_ttl_s = {TTL}
[checkpoint]
interval_s = 0.5
[[caches]]
name = "default"
partitions = {PARTS}
backups = 1
"""
KEYS = [f"k{i}" for i in range(32)]


def _pair(tmp_path, nodes):
    secret = write_secret(str(tmp_path / "secret"))
    cfg = tmp_path / "node.toml"
    cfg.write_text(CONFIG)
    n1 = NodeProc(str(tmp_path), "n1", secret, config=str(cfg)).start()
    n2 = NodeProc(str(tmp_path), "n2", secret, config=str(cfg)).start()
    nodes += [n1, n2]
    wait_settled(n1.address, secret, 2, 1)
    return secret, n1, n2


def _put_all(seeds, secret, value: str) -> None:
    with Client(seeds, secret_file=secret, timeout=60) as c:
        for k in KEYS:
            c.put("default", k, value)


def _backup_of(n2: NodeProc, n1: NodeProc, secret: str, tmp_path) -> str:
    """A copy of n2's data directory taken while it was stopped (a backup), n2 back."""
    assert n2.stop() == 0, n2.tail()
    saved = str(tmp_path / "n2-backup")
    shutil.copytree(n2.data, saved)
    n2.mark_restart()
    n2.start()
    wait_settled(n1.address, secret, 2, 1)
    return saved


def _restore(n2: NodeProc, saved: str) -> None:
    shutil.rmtree(n2.data)
    shutil.copytree(saved, n2.data)


def _read(seeds, secret, timeout: float, key: str) -> bytes | None | str:
    with Client(seeds, secret_file=secret, timeout=timeout) as c:
        try:
            return c.get("default", key)
        except Exception as e:              # no primary to read from: waiting is right
            return f"refused: {type(e).__name__}"


def _reads(seeds, secret, timeout: float = 5.0 * TTL) -> dict[str, bytes | None | str]:
    """Every key read side by side, each by a client of its own that retries a refused
    read for ``timeout``: every key is tried again and again for 5 lease TTLs, past the
    lease expiry and any election the kill could bring (one after the other, 32 refused
    reads would wait 32 x ``timeout``)."""
    with ThreadPoolExecutor(len(KEYS)) as ex:
        got = ex.map(lambda k: _read(seeds, secret, timeout, k), KEYS)
        return dict(zip(KEYS, got))


@pytest.mark.slow
def test_a_restored_copy_restarted_within_its_lease_never_serves_the_old_values(tmp_path, nodes):
    secret, n1, n2 = _pair(tmp_path, nodes)
    _put_all([n1.address], secret, "old")
    saved = _backup_of(n2, n1, secret, tmp_path)
    _put_all([n1.address, n2.address], secret, "new")     # acknowledged by both copies
    n2.kill()
    _restore(n2, saved)
    n2.mark_restart()
    n2.start()                             # within its lease TTL: it was never declared dead
    time.sleep(1.0)
    n1.kill()                              # the only copy with the new values
    got = _reads([n2.address], secret)
    assert not [k for k, v in got.items() if v == b"old"], got
    log = open(n2.log).read().split("=== restart")[-1]
    assert "RETURNING" in log or "returning copy" in log, n2.tail(40)
    n1.mark_restart()
    n1.start()
    wait_settled(n1.address, secret, 2, 1, timeout=90)
    with Client([n1.address, n2.address], secret_file=secret, timeout=30) as c:
        assert all(c.get("default", k) == b"new" for k in KEYS)


@pytest.mark.slow
def test_the_restored_copy_back_first_waits_for_the_one_with_the_newer_values(tmp_path, nodes):
    secret, n1, n2 = _pair(tmp_path, nodes)
    _put_all([n1.address], secret, "old")
    saved = _backup_of(n2, n1, secret, tmp_path)
    _put_all([n1.address, n2.address], secret, "new")
    n1.kill()
    n2.kill()
    _restore(n2, saved)
    time.sleep(3.0)                        # both leases gone
    n2.mark_restart()
    n2.start()
    time.sleep(3.0)
    got = _reads([n2.address], secret)
    assert all(isinstance(v, str) and v.startswith("refused") for v in got.values()), got
    n1.mark_restart()
    n1.start()                             # every in-sync copy back: n1 is at the higher counter
    wait_settled(n1.address, secret, 2, 1, timeout=90)
    with Client([n1.address, n2.address], secret_file=secret, timeout=30) as c:
        assert all(c.get("default", k) == b"new" for k in KEYS)
    log = open(n1.log).read()
    assert "elected by the controller" in log or "every in-sync copy came back" in log + open(n2.log).read()
