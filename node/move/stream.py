"""The streaming install's host side: a :class:`transfer.ReceiveObserver` that feeds
p's :class:`indexes.StreamingIndex` from the pages the transfer writes, on a thread of
its own, while the file arrives. The engine then loads the streamed keys instead of
rebuilding from the installed file (``index rebuild`` stage, :mod:`.rebuild`).

Why a thread: the decode and the index work are CPU in this process; on the receive
loop or the ChunkSink thread they would hold back the socket and the chunk hashing.
The thread decodes the ranges the transfer changed, one at a time, newest state of
the file each time; what it has not reached when the file is complete is decoded at
the load (``StreamingIndex.finish``), which also checks every range against the
installed file. Crash point ``demander.mid_stream_index`` after each range decoded:
nothing here is durable (keys in memory, LMDB untouched), so a crash leaves what
``demander.mid_receive`` leaves.
"""
from __future__ import annotations

import logging
import threading

from faults import crashpoint
from indexes import IndexStore, StreamedKeys, StreamingIndex, StreamingUnavailable

log = logging.getLogger("ferry.node.filemove")


class StreamFeed:
    """One move's streamed index build, across the fetch attempts of that move (each
    ``begin`` starts afresh: a new supplier's file is another file)."""

    def __init__(self, indexes: IndexStore, cache: str, p: int) -> None:
        self.indexes, self.cache, self.p = indexes, cache, p
        self.build: StreamingIndex | None = None
        self.complete = False            # the last fetch ended with a checked file
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    # -- transfer.ReceiveObserver ---------------------------------------------------
    def begin(self, tmp_path: str, page_size: int, page_count: int, chunk_size: int,
              counter: int) -> None:
        self._halt()
        self.complete, self.error = False, None
        self.build = self.indexes.streaming(self.p, tmp_path, page_size, page_count,
                                            max(1, chunk_size // page_size), counter)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"ferry-stream-ix-{self.p}",
                                        daemon=True)
        self._thread.start()

    def pages_written(self, first: int, stop: int) -> None:
        build = self.build
        if build is not None:
            build.pages_written(first, stop)
            self._wake.set()

    def end(self, ok: bool) -> None:
        self._halt()
        self.complete = ok and self.error is None
        if not ok:
            self.build = None

    # -- the thread -----------------------------------------------------------------------
    def _run(self) -> None:
        build = self.build
        assert build is not None
        try:
            while not self._stop.is_set():
                if not build.step():
                    self._wake.wait(0.05)
                    self._wake.clear()
                    continue
                crashpoint("demander.mid_stream_index")
        except BaseException as e:      # the load rebuilds from the file instead
            self.error = e
            log.warning("stage=transfer cache=%s partition=%d streamed index stopped: %s; "
                        "the index is rebuilt from the installed file", self.cache, self.p, e)

    def _halt(self) -> None:
        t, self._thread = self._thread, None
        if t is not None:
            self._stop.set()
            self._wake.set()
            t.join()

    # -- the engine's side ---------------------------------------------------------------
    def result(self, installed: str) -> StreamedKeys:
        """The streamed keys, checked against (and completed from) the installed file;
        StreamingUnavailable when this move's last fetch was not streamed whole."""
        build = self.build
        if build is None or not self.complete:
            raise StreamingUnavailable(f"the file of {self.cache}/{self.p} was not streamed "
                                       f"({self.error or 'no complete streamed fetch'})")
        self.build = None
        return build.finish(installed)

    def close(self) -> None:
        self._halt()
        self.build = None


__all__ = ["StreamFeed"]
