"""Foreground protection asks its peers for their latency once per REPORT_FRESH_S,
however many moves start meanwhile (each start wakes a tick)."""
from __future__ import annotations

from node.acklatency import LatencyReport
from node.admission import REPORT_FRESH_S
from node.errors import Unavailable
from node.move import Move

from test_admission import admission


class _Pool:
    def __init__(self) -> None:
        self.asked: list[str] = []
        self.down: set[str] = set()

    def request(self, addr: str, req: object, timeout: float = 0) -> LatencyReport:
        self.asked.append(addr)
        if addr in self.down:
            raise Unavailable(f"{addr} does not answer")
        return LatencyReport(p99_s=0.001, samples=100, baseline_s=0.001)


def test_a_tick_per_started_move_does_not_ask_the_peers_each_time() -> None:
    adm, ctx, _ = admission()
    pool = ctx.pool = _Pool()                                       # type: ignore[attr-defined]
    peers = {"n2": "a2", "n3": "a3"}
    adm._peers = lambda: dict(peers)                                # type: ignore[method-assign]
    ctx.moves.running[("default", 1)] = Move("default", 1, mode="files")
    adm.tick()
    assert sorted(pool.asked) == ["a2", "a3"]
    for _ in range(10):                       # ten moves start within REPORT_FRESH_S
        adm.started()
        adm.tick()
    assert len(pool.asked) == 2
    adm.clock.t += REPORT_FRESH_S * 1.01                            # type: ignore[attr-defined]
    adm.tick()
    assert sorted(pool.asked[2:]) == ["a2", "a3"]
    peers["n3"] = "a3-new"                    # a peer at another address: asked at once
    adm.tick()
    assert pool.asked[4:] == ["a3-new"]
    pool.down.add("a2")
    adm.clock.t += REPORT_FRESH_S * 1.01                            # type: ignore[attr-defined]
    adm.tick()
    adm.tick()                                # a peer that failed is asked again, not cached
    assert pool.asked[5:].count("a2") == 2 and pool.asked[5:].count("a3-new") == 1
