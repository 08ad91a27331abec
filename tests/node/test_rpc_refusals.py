"""Requests refused for a full disk, a read-only file system or no descriptors left:
each gets its error reply, and the log gets one WARNING per cause and minute that says
what and where, not a traceback per request. Any other handler failure still logs
its traceback. The refusals are counted in the node's metrics."""
from __future__ import annotations

import errno
import logging
import os

import pytest

from checkpoint import CheckpointError
from faults import latch
from node.metrics import Metrics
from node.rpc import RpcServer
from wal import OutOfDiskError

from nodeharness import free_port


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(latch, "WARNINGS", latch._Warnings())


def _refusal(kind: str) -> BaseException:
    if kind == "disk_full":
        return OutOfDiskError("/data/caches/default/wal/0000.wal", 4096, "No space left on device")
    code = errno.EROFS if kind == "read_only" else errno.EMFILE
    os_err = OSError(code, os.strerror(code), "/data/caches/default/part-3.bin")
    try:
        raise CheckpointError("store /data/caches/default refuses writes") from os_err
    except CheckpointError as e:
        return e


def _server(exc: BaseException) -> RpcServer:
    def dispatch(method, args, role):
        raise exc
    return RpcServer(f"127.0.0.1:{free_port()}", b"s" * 32, dispatch)


@pytest.mark.parametrize("kind,says", [("disk_full", "disk full on /data/caches/default/wal/0000.wal: "
                                                     "4096 bytes needed"),
                                       ("read_only", "filesystem read-only at /data/caches/default/part-3.bin"),
                                       ("out_of_fds", "out of file descriptors at ")])
def test_refusals_warn_once_without_traceback(kind: str, says: str, caplog) -> None:
    caplog.set_level(logging.INFO)
    before = latch.refusals().get(kind, 0)
    srv = _server(_refusal(kind))
    try:
        replies = [srv._handle({"id": i, "m": "put", "a": {}}, "client") for i in range(200)]
    finally:
        srv.stop()
    assert all(not r["ok"] and r["e"]["message"] for r in replies)
    # (this test's records only: a thread another test left in this worker may log too)
    lines = [r for r in caplog.records
             if r.levelno >= logging.WARNING and r.name in ("ferry.storage", "ferry.node.rpc")]
    assert len(lines) == 1 and says in lines[0].getMessage(), [r.getMessage() for r in lines]
    assert lines[0].exc_info is None
    assert latch.refusals()[kind] == before + 200
    m = Metrics()
    assert f'ferry_node_storage_refusals_total{{cause="{kind}"}} {before + 200:.1f}' in m.render()


def test_other_failures_keep_their_traceback(caplog) -> None:
    srv = _server(RuntimeError("a bug"))
    try:
        reply = srv._handle({"id": 1, "m": "put", "a": {}}, "client")
    finally:
        srv.stop()
    assert reply["e"]["code"] == "internal"
    assert [r.exc_info is not None for r in caplog.records
            if r.levelno >= logging.ERROR and r.name in ("ferry.storage", "ferry.node.rpc")] == [True]
