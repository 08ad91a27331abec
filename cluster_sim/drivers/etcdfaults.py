"""The run's etcd members as fault targets: ``kill-etcd`` (SIGKILL one member, the
raft leader, or all) and ``restart-etcd`` (the same member, or every dead one).

Members are named ``etcd1``..``etcdN`` (``node.etcdserver.EtcdCluster``);
``@leader`` is the member that is leader when the event fires (asked with etcd's
``/v3/maintenance/status``), and a later ``restart-etcd @leader`` restarts that same
member.
"""
from __future__ import annotations

import json
import urllib.request
from typing import Any

from ..errors import ProcessError
from ..scenario import LEADER
from ..timeline import Timeline


class EtcdFaults:
    def __init__(self, etcd: Any, timeline: Timeline) -> None:
        self.etcd, self.timeline = etcd, timeline
        self.killed_leader: str | None = None

    def names(self) -> list[str]:
        return [m.name for m in self.etcd.members]

    def leader(self) -> str | None:
        """The name of the raft leader, asked of every live member (None: no leader)."""
        ids: dict[int, str] = {}
        lead = 0
        ctx = self.etcd.ssl_context()
        for m in self.etcd.members:
            if not m.alive():
                continue
            try:
                req = urllib.request.Request(m.url + "/v3/maintenance/status", data=b"{}",
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=2.0, context=ctx) as r:
                    doc = json.loads(r.read())
            except (OSError, ValueError):
                continue
            ids[int(doc["header"]["member_id"])] = m.name
            lead = lead or int(doc.get("leader", 0))
        return ids.get(lead)

    def _index(self, name: str) -> int:
        names = self.names()
        if name not in names:
            raise ProcessError(f"no etcd member {name!r}; members: {', '.join(names)}")
        return names.index(name)

    def kill(self, which: str) -> list[str]:
        """SIGKILL member ``which`` (``etcdK``, ``@leader``) or, when empty, all."""
        if which == LEADER:
            name = self.leader()
            if name is None:
                raise ProcessError("kill-etcd @leader: no etcd member says it has a leader")
            self.killed_leader = name
            targets = [name]
        else:
            targets = [which] if which else [m.name for m in self.etcd.members if m.alive()]
        for name in targets:
            self.etcd.kill(self._index(name))
        self.timeline.mark(",".join(targets), "kill-etcd", "SIGKILL" + (" (the leader)" if which == LEADER else ""))
        return targets

    def restart(self, which: str) -> list[str]:
        """Restart member ``which`` (``@leader``: the leader killed before) or, when
        empty, every dead member; returns once the restarted members are healthy (when
        a quorum is up)."""
        if which == LEADER:
            if self.killed_leader is None:
                raise ProcessError("restart-etcd @leader: no leader was killed before")
            which = self.killed_leader
        targets = [which] if which else [m.name for m in self.etcd.members if not m.alive()]
        for name in targets:
            self.etcd.restart(self._index(name))
        self.timeline.mark(",".join(targets) or "-", "restart-etcd", "")
        return targets
