"""node/metrics.py on prometheus_client: the exposition parses with the library's own
parser, names/types/labels are the documented ones, collector gauges of ended moves go
away, the HTTP server binds HOST:PORT and frees it on shutdown; and a real node process
started with --metrics-listen serves /metrics that parse."""
from __future__ import annotations

import socket
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from node.metrics import METRICS, Metrics, serve

from nodeharness import NodeProc, free_port, write_secret


def families(text: str) -> dict[str, object]:
    """Family name (counters with ``_total``, as documented) -> parsed family."""
    out = {}
    for f in text_string_to_metric_families(text):
        out[f.name + "_total" if f.type == "counter" else f.name] = f
    return out


def samples(fam) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in fam.samples}


def scrape(url: str) -> tuple[str, str]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.headers.get("Content-Type", ""), r.read().decode()


def assert_port_free(port: int) -> None:
    """No socket listens on the port any more (SO_REUSEADDR: the closed connections'
    TIME_WAIT does not count; a listening socket still would)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


def test_every_declared_metric_is_exposed_with_its_type_and_labels() -> None:
    m = Metrics()
    m.inc("ferry_node_updates_total", cache="default", op="put")
    m.inc("ferry_node_updates_total", 2, cache="default", op="remove")
    m.observe("ferry_node_update_seconds", 0.25)
    m.observe("ferry_node_update_seconds", 0.75)
    m.observe("ferry_node_move_stage_seconds", 1.5, stage="transfer")
    m.inc("ferry_node_move_bytes_total", 4096, cache="default")
    fams = families(m.render())
    assert set(fams) == set(METRICS)
    for name, (kind, _, labels) in METRICS.items():
        assert fams[name].type == kind, name
        for s in fams[name].samples:
            assert tuple(sorted(s.labels)) == labels, (name, s)
    ups = samples(fams["ferry_node_updates_total"])
    assert ups[("ferry_node_updates_total", (("cache", "default"), ("op", "put")))] == 1
    assert ups[("ferry_node_updates_total", (("cache", "default"), ("op", "remove")))] == 2
    lat = samples(fams["ferry_node_update_seconds"])
    assert lat[("ferry_node_update_seconds_count", ())] == 2
    assert lat[("ferry_node_update_seconds_sum", ())] == pytest.approx(1.0)
    assert samples(fams["ferry_node_move_bytes_total"]) == {
        ("ferry_node_move_bytes_total", (("cache", "default"),)): 4096}
    # no extra series (``_created``) beside the documented ones
    assert not [f for f in text_string_to_metric_families(m.render()) if f.name.endswith("_created")]


def test_a_bad_call_is_logged_and_dropped_never_raised(caplog) -> None:
    m = Metrics()
    m.inc("ferry_node_updates_total", cache="default")              # missing label op
    m.set("ferry_node_updates_total", 3, cache="default", op="put")  # a counter is not set
    m.inc("ferry_node_moves_done_total", -1, cache="default")       # counters only go up
    m.inc("ferry_node_something_new_total", 2, kind="x")            # undeclared: on first use
    fams = families(m.render())
    assert samples(fams["ferry_node_updates_total"]) == {}
    assert samples(fams["ferry_node_moves_done_total"]) == {}
    assert samples(fams["ferry_node_something_new_total"]) == {
        ("ferry_node_something_new_total", (("kind", "x"),)): 2}
    assert sum("not recorded" in r.getMessage() for r in caplog.records) == 3


def test_collector_gauges_are_fresh_and_those_of_ended_moves_go_away() -> None:
    m = Metrics()
    running = {"default/1": 40, "default/2": 7}

    def collect(mm: Metrics) -> None:
        mm.set("ferry_node_moves_in_progress", len(running))
        for key, backlog in running.items():
            cache, p = key.split("/")
            mm.set("ferry_node_replay_backlog", backlog, cache=cache, partition=p)
    m.collectors.append(collect)
    first = samples(families(m.render())["ferry_node_replay_backlog"])
    assert first == {("ferry_node_replay_backlog", (("cache", "default"), ("partition", "1"))): 40,
                     ("ferry_node_replay_backlog", (("cache", "default"), ("partition", "2"))): 7}
    del running["default/1"]                       # that move reached OWNING
    fams = families(m.render())
    assert samples(fams["ferry_node_replay_backlog"]) == {
        ("ferry_node_replay_backlog", (("cache", "default"), ("partition", "2"))): 7}
    assert samples(fams["ferry_node_moves_in_progress"]) == {("ferry_node_moves_in_progress", ()): 1}


def test_a_failing_collector_does_not_fail_the_scrape() -> None:
    m = Metrics()
    m.collectors.append(lambda mm: 1 / 0)
    m.collectors.append(lambda mm: mm.set("ferry_node_topology_version", 9))
    fams = families(m.render())
    assert samples(fams["ferry_node_topology_version"]) == {("ferry_node_topology_version", ()): 9}


def test_server_binds_host_port_serves_the_render_and_frees_the_port() -> None:
    m = Metrics()
    m.inc("ferry_node_moves_done_total", cache="default")
    port = free_port()
    srv = serve(f"127.0.0.1:{port}", m)
    try:
        ctype, text = scrape(f"http://127.0.0.1:{port}/metrics")
        assert ctype.startswith("text/plain")
        assert families(text).keys() == families(m.render()).keys()
        assert samples(families(text)["ferry_node_moves_done_total"]) == {
            ("ferry_node_moves_done_total", (("cache", "default"),)): 1}
    finally:
        srv.shutdown()
    with pytest.raises(urllib.error.URLError):
        scrape(f"http://127.0.0.1:{port}/metrics")
    assert_port_free(port)


def test_a_node_process_serves_metrics_that_parse(tmp_path, nodes) -> None:
    from node import Client
    from node.wire import Pool, load_secret
    secret = write_secret(str(tmp_path / "secret"))
    mport = free_port()
    n = NodeProc(str(tmp_path), "n1", secret, partitions=4,
                 extra_args=["--metrics-listen", f"127.0.0.1:{mport}"])
    nodes.append(n)
    n.start()
    with Client([n.address], secret_file=secret) as c:
        for i in range(5):
            c.put("default", f"k{i}", f"v{i}")
        c.remove("default", "k0")
    ctype, text = scrape(f"http://127.0.0.1:{mport}/metrics")
    assert ctype.startswith("text/plain")
    fams = families(text)
    assert set(METRICS) <= set(fams)
    ups = samples(fams["ferry_node_updates_total"])
    assert ups[("ferry_node_updates_total", (("cache", "default"), ("op", "put")))] == 5
    assert ups[("ferry_node_updates_total", (("cache", "default"), ("op", "remove")))] == 1
    lat = samples(fams["ferry_node_update_seconds"])
    assert lat[("ferry_node_update_seconds_count", ())] == 6
    assert 0 < lat[("ferry_node_update_seconds_sum", ())] < 60
    parts = samples(fams["ferry_node_partitions"])
    assert parts[("ferry_node_partitions", (("cache", "default"), ("state", "OWNING")))] == 4
    assert fams["ferry_node_moves_by_stage"].type == "gauge"
    assert {s.labels["stage"] for s in fams["ferry_node_moves_by_stage"].samples} >= {
        "transfer", "replay", "index rebuild"}
    # the metrics RPC returns the same exposition
    pool = Pool(load_secret(secret), role="client")
    try:
        rpc = families(pool.call(n.address, "metrics"))
    finally:
        pool.close()
    assert rpc.keys() == fams.keys()
    assert samples(rpc["ferry_node_updates_total"]) == ups
    # a graceful stop shuts the server down with the node: exit 0, port free
    assert n.stop() == 0
    assert_port_free(mport)


def test_the_grafana_dashboard_queries_only_exposed_series() -> None:
    import json
    import os
    import re
    path = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "grafana-rebalance.json")
    with open(path) as f:
        dash = json.load(f)
    series = set()
    for name, (kind, _, _) in METRICS.items():
        series |= {name + "_sum", name + "_count"} if kind == "summary" else {name}
    exprs = {p["title"]: " ".join(t["expr"] for t in p.get("targets", [])) for p in dash["panels"]}
    used = set(re.findall(r"ferry_node_\w+", " ".join(exprs.values())))
    assert used and used <= series, used - series
    for title, metric in (("Moves by stage", "ferry_node_moves_by_stage"),
                          ("Bytes/s received by moves", "ferry_node_move_bytes_total"),
                          ("Replay lag", "ferry_node_replay_lag_seconds"),
                          ("Foreground update latency (mean)", "ferry_node_update_seconds_count")):
        assert metric in exprs[title], title
