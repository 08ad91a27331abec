"""The type of a decoded JSON value: what every control-plane key holds (etcd), and
what partition records, settings and reports are made of."""
from __future__ import annotations

from typing import Any, TypedDict, Union

Json = Union[None, bool, int, float, str, list["Json"], dict[str, "Json"]]
JsonDoc = dict[str, Json]
# a JSON document as built for, or read from, a peer's reply field by field (the
# reader converts each field it uses: int(), a dataclass, a parser that refuses garbage)
WireDoc = dict[str, Any]

# One running move as a node's RPC ``moves`` reports it (node/move/progress.py
# ``MoveProgress.status``; a files-mode move has more fields, docs/node.md); read by
# ``ferry cluster status`` and ``ferry reassign status``, which take what they show
MoveDoc = TypedDict("MoveDoc", {
    "cache": str, "partition": int, "from": "str | None", "to": str, "mode": str, "stage": str,
    "bytes": int, "bytes_total": int, "rate_bps": float, "backlog": int, "eta_s": "float | None",
    "replayed": int, "replay_rate": float, "ingest_rate": float, "copy": "dict[str, Json]",
}, total=False)

__all__ = ["Json", "JsonDoc", "WireDoc", "MoveDoc"]
