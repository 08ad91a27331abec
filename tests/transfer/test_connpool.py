"""Kept connections (transfer/connpool.py): a demander's next fetch from a supplier
goes over the connection of its last successful one, with every check as before."""
from __future__ import annotations

import os
import time

import pytest

from transfer import Demander, DirectoryStorage, RemoteError, SupplierServer
from transfer import connpool
from transfer.connpool import ConnPool

from transfer_helpers import SECRET, peer_of, read, wait_until, write_part

pytestmark = pytest.mark.timeout(120)


def _fetch(dst: str, srv: SupplierServer, p: int, pool: ConnPool | None, **kw):  # type: ignore[no-untyped-def]
    return Demander(DirectoryStorage(dst), peer_of(srv), SECRET, timeout=10,
                    reuse=pool is not None, pool=pool, **kw).fetch(p)


def test_consecutive_fetches_share_one_authenticated_connection(src, dst) -> None:
    data = {p: write_part(src, p, size) for p, size in ((1, 5000), (2, 0), (3, 9 << 20))}
    pool = ConnPool()
    with SupplierServer(DirectoryStorage(src), SECRET).start() as srv:
        stages = []
        for p in (1, 2, 3):
            res = _fetch(dst, srv, p, pool, chunk_size=1 << 20)
            assert read(os.path.join(dst, f"part-{p}.bin")) == data[p]
            stages.append(res.stages)
        assert wait_until(lambda: srv.stats.transfers_ok == 3) and srv.stats.sessions == 1
        assert pool.reused == 2 and pool.idle() == 1
        assert "handshake" in stages[0] and "handshake" not in stages[1]
        # the same partition again: not over a connection that carried it
        _fetch(dst, srv, 1, pool)
        assert srv.stats.sessions == 2 and pool.idle() == 2
        pool.close_idle()
        assert wait_until(lambda: not srv._sessions)
        assert srv.stats.transfers_failed == 0          # a close between DEMANDs is clean


def test_off_unless_asked(src, dst) -> None:
    write_part(src, 1, 100)
    write_part(src, 2, 100)
    assert not connpool.POOL.enabled                   # a library user's default
    with SupplierServer(DirectoryStorage(src), SECRET).start() as srv:
        for p in (1, 2):
            Demander(DirectoryStorage(dst), peer_of(srv), SECRET, timeout=10).fetch(p)
        assert srv.stats.sessions == 2 and connpool.POOL.idle() == 0


def test_a_failed_fetch_does_not_keep_its_connection(src, dst) -> None:
    write_part(src, 1, 100)
    write_part(src, 2, 100)
    pool = ConnPool()
    with SupplierServer(DirectoryStorage(src), SECRET).start() as srv:
        _fetch(dst, srv, 1, pool)
        with pytest.raises(RemoteError):
            _fetch(dst, srv, 7, pool)                   # not held there
        assert pool.idle() == 0                          # that connection is gone
        _fetch(dst, srv, 2, pool)
        assert srv.stats.sessions == 2 and pool.reused == 1


def test_a_connection_the_supplier_closed_is_not_used(src, dst) -> None:
    data = write_part(src, 2, 3000)
    write_part(src, 1, 100)
    pool = ConnPool()
    # the supplier ends an idle session after 0.3 s (its read timeout)
    with SupplierServer(DirectoryStorage(src), SECRET, timeout=0.3).start() as srv:
        _fetch(dst, srv, 1, pool)
        assert wait_until(lambda: not srv._sessions)
        _fetch(dst, srv, 2, pool)
        assert read(os.path.join(dst, "part-2.bin")) == data
        assert srv.stats.sessions == 2 and pool.reused == 0


def test_closed_after_the_check_the_fetch_connects_again(src, dst, monkeypatch) -> None:
    data = write_part(src, 2, 3000)
    write_part(src, 1, 100)
    pool = ConnPool()
    with SupplierServer(DirectoryStorage(src), SECRET, timeout=0.3).start() as srv:
        _fetch(dst, srv, 1, pool)
        assert wait_until(lambda: not srv._sessions)
        monkeypatch.setattr(connpool, "_spoken", lambda conn: False)   # the close not seen
        res = _fetch(dst, srv, 2, pool)
        assert pool.reused == 1 and "handshake" in res.stages
        assert read(os.path.join(dst, "part-2.bin")) == data
        assert wait_until(lambda: srv.stats.transfers_ok == 2) and srv.stats.sessions == 2


def test_idle_connections_are_closed_by_the_pool(src, dst) -> None:
    write_part(src, 1, 100)
    pool = ConnPool(idle_s=0.3)
    with SupplierServer(DirectoryStorage(src), SECRET).start() as srv:
        _fetch(dst, srv, 1, pool)
        assert pool.idle() == 1
        t0 = time.monotonic()
        assert wait_until(lambda: pool.idle() == 0 and not srv._sessions)
        assert time.monotonic() - t0 < 5
        assert srv.stats.transfers_failed == 0


def test_kept_connections_are_per_secret(src, dst) -> None:
    write_part(src, 1, 100)
    write_part(src, 2, 100)
    pool = ConnPool()
    other = b"0" * 32
    with SupplierServer(DirectoryStorage(src), SECRET).start() as srv:
        _fetch(dst, srv, 1, pool)
        with pytest.raises(Exception):                  # noqa: B017 - the handshake refuses it
            Demander(DirectoryStorage(dst), peer_of(srv), other, timeout=10, reuse=True,
                     pool=pool).fetch(2)
        assert pool.reused == 0 and pool.idle() == 1
