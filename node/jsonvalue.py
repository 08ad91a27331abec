"""The type of a decoded JSON value: what every control-plane key holds (etcd), and
what partition records, settings and reports are made of."""
from __future__ import annotations

from typing import Union

Json = Union[None, bool, int, float, str, list["Json"], dict[str, "Json"]]
JsonDoc = dict[str, Json]

__all__ = ["Json", "JsonDoc"]
