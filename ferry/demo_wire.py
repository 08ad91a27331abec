"""What the demo's supplier and demander say to each other beyond the transfer
protocol, and the demo's keys and values. (The temp-WAL records are the move engine's:
node/move/tempwal.py, docs/formats.md.)"""
from __future__ import annotations

import json
from enum import IntEnum

from transfer.frames import register_types


class DemoFrame(IntEnum):
    SUBSCRIBE = 200      # demander -> supplier: forward updates of these partitions -> OK {c}
    START_WRITES = 201
    STOP_WRITES = 202
    SHUTDOWN = 203
    UPDATE = 204         # supplier -> demander: one acknowledged-once-durable update
    OK = 205


register_types(DemoFrame)

CITIES = ["Oslo", "Lagos", "Lima", "Pune", "Kyiv", "Quito", "Hanoi", "Dakar", "Perth", "Riga"]


def demo_key(i: int) -> bytes:
    return b"user:%08d" % i


def demo_value(i: int, version: int) -> bytes:
    return json.dumps({"id": i, "city": CITIES[(i + version) % len(CITIES)],
                       "score": (i * 7919 + version) % 1000, "v": version},
                      separators=(",", ":")).encode()
