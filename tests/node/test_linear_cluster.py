"""Reads and request ids over real node processes (2 nodes, backups 1): a
linearizable get is the primary's alone, a stale one any OWNING copy's, from the client
and from ``ferry cluster get [--stale]``; a put repeated with its request id is applied
once, whichever node answers it."""
from __future__ import annotations

from click.testing import CliRunner

from ferry.cli import cli
from node import Client, partition_of
from node.errors import NodeError, Superseded
from node.wire import Pool, load_secret

from test_filemove import start_pair


def test_reads_request_ids_and_the_cli(tmp_path, nodes) -> None:
    secret, _, n1, n2 = start_pair(tmp_path, nodes)
    with Client([n1.address, n2.address], secret_file=secret, timeout=20) as c:
        assert c.put("default", "k", "v1") >= 1
        assert c.get("default", "k") == b"v1"
        assert c.get("default", "k", consistency="stale") == b"v1"
        m = c.refresh()
        p = partition_of(b"k", m.caches["default"].partitions)
        prim = m.primary("default", p)
        backup = (n2 if prim == n1.id else n1).address
        primary = (n1 if prim == n1.id else n2).address
    pool = Pool(load_secret(secret), role="client")
    try:
        # the backup holds an OWNING copy: it serves a stale read, not a linearizable one
        assert pool.call(backup, "get", cache="default", key=b"k", consistency="stale") == b"v1"
        try:
            pool.call(backup, "get", cache="default", key=b"k")
            raise AssertionError("a backup served a linearizable read")
        except NodeError as e:
            assert e.code == "not_primary" and e.hint == primary
        # one request id, sent twice: applied once
        rid = ["test-client", 5, 5]
        first = pool.call(primary, "put", cache="default", key=b"k", value=b"v2", rid=rid)
        again = pool.call(primary, "put", cache="default", key=b"k", value=b"v2", rid=rid)
        assert first == again
        later = pool.call(primary, "put", cache="default", key=b"k", value=b"v3", rid=["test-client", 6, 6])
        assert later == first + 1
        try:
            pool.call(primary, "put", cache="default", key=b"k", value=b"v2", rid=["test-client", 5, 5])
            raise AssertionError("a late copy of a request the client gave up on was applied")
        except Superseded:
            pass
        # the backup applied every one of them once
        assert pool.call(backup, "get", cache="default", key=b"k", consistency="stale") == b"v3"
    finally:
        pool.close()
    run = CliRunner().invoke
    base = ["cluster", "get", "--seed", n1.address, "--secret-file", secret]
    assert run(cli, base + ["k"]).output.strip() == "v3"
    assert run(cli, base + ["--stale", "k"]).output.strip() == "v3"
    r = run(cli, base + ["--stale", "absent-key"])
    assert r.exit_code == 1
