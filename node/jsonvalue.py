"""The type of a decoded JSON value: what every control-plane key holds (etcd), and
what partition records, settings and reports are made of."""
from __future__ import annotations

from typing import Any, Union

Json = Union[None, bool, int, float, str, list["Json"], dict[str, "Json"]]
JsonDoc = dict[str, Json]
# a JSON document as built for, or read from, a peer's reply field by field (the
# reader converts each field it uses: int(), a dataclass, a parser that refuses garbage)
WireDoc = dict[str, Any]

__all__ = ["Json", "JsonDoc", "WireDoc"]
