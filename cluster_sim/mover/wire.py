"""What the harness, the mover supplier and the mover demander say to each other, on
top of transfer.frames + the transfer.auth handshake (the one framing of Ferry).

Roles at the handshake: ``sim-client`` (the harness: PUT/REMOVE, answered OK/FAIL) and
``sim-replica`` (the demander: one SUBSCRIBE per partition, then the supplier pushes
UPDATEs on that connection and the demander answers ACK once the update is durable in
its temp WAL or applied). A write is acknowledged to the harness only after every
subscriber of its partition answered ACK; a subscriber that fails is dropped (its copy
is then stale and is moved again when it comes back).
"""
from __future__ import annotations

from enum import IntEnum

from transfer.frames import register_types


class SimFrame(IntEnum):
    PUT = 220          # {"k": bytes, "v": bytes}
    REMOVE = 221       # {"k": bytes}
    OK = 222           # {"c": counter}
    FAIL = 223         # {"why": str}
    SUBSCRIBE = 224    # {"p": partition} -> OK {"c": the supplier's counter of p}
    UPDATE = 225       # {"p", "k", "v" (None: remove), "c"}
    ACK = 226          # {}


register_types(SimFrame)

CACHE = "default"
