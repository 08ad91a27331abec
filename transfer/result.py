"""What a fetch reports: progress events while it runs and a FetchResult at the end."""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field


@dataclass
class Progress:
    partition: int
    stage: str
    done: int          # bytes of the partition present (reused + received)
    total: int
    wire: int          # bytes received over the wire this time


@dataclass
class FetchResult:
    partition: int
    cache: str
    bytes: int
    bytes_wire: int
    bytes_reused: int
    seconds: float
    verified: bool
    counter: int
    preimages: int = 0
    resent_chunks: int = 0
    stages: dict[str, float] = field(default_factory=dict)
    spliced: bool = False      # chunk data went socket -> file by splice (transfer.splice)
    # "full", "resume" (chunks held from an earlier fetch were offered) or "delta" (only
    # the pages that differ from this side's older copy travelled: transfer.delta)
    mode: str = "full"
    pages: int = 0             # the partition's pages (page files)
    pages_sent: int = 0        # pages that travelled in a delta fetch
    delta_refused: str = ""    # why an offered base was not used (a full copy went)
    # how the file data travelled (transfer.tls): "sendfile" (in clear, zero-copy),
    # "tls-userspace" (TLS, encrypted through user space), "ktls-sendfile" (TLS in the
    # kernel; never chosen here: only detected) or "channel" (an SSH tunnel)
    path: str = "sendfile"

    @property
    def mb_per_s(self) -> float:
        return self.bytes_wire / 1e6 / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> dict[str, object]:
        """The per-partition object of ``ferry transfer fetch --json`` (docs/transfer.md)."""
        return {"partition": self.partition, "bytes": self.bytes, "bytes_wire": self.bytes_wire,
                "bytes_reused": self.bytes_reused, "seconds": round(self.seconds, 3),
                "mb_per_s": round(self.mb_per_s, 1), "verified": self.verified,
                "mode": self.mode, "pages": self.pages, "pages_sent": self.pages_sent,
                "delta_refused": self.delta_refused, "path": self.path}

    def as_dict(self) -> dict[str, object]:
        return asdict(self) | {"mb_per_s": self.mb_per_s}


def free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize
