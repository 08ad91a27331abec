"""Reading a partition file: its meta page, and whole pages in large chunks."""
from __future__ import annotations

import os
from typing import Callable, Iterator

from .check import PageProblem, check_page
from .errors import CorruptPageError
from .layout import META_END, Meta, decode_meta, valid_page_size


def read_meta(path: str) -> Meta:
    """The meta page of ``path``; CorruptPageError when it is unreadable."""
    with open(path, "rb") as f:
        head = f.read(META_END)
        if len(head) < META_END:
            raise CorruptPageError(path, 0, 0, f"file is {len(head)} bytes, too short for a meta page")
        page_size = decode_meta(head).page_size
        if not valid_page_size(page_size):
            raise CorruptPageError(path, 0, 0, f"meta page names invalid page size {page_size} "
                                               "(bad meta page or not a partition file)")
        f.seek(0)
        buf = f.read(page_size)
    reason = check_page(buf, 0, page_size)
    if reason:
        raise CorruptPageError(path, 0, 0, reason)
    m = decode_meta(buf)
    return Meta(m.version, m.partition, m.page_size, m.page_count, m.counter)


class PageReader:
    """Sequential reads of whole pages in large chunks, and page reads for overflow
    chains that take the page from a chunk when it is (or will soon be) read anyway.

    Chunks are numbered from the first page read; the sequential pass holds the
    current one and the one before, and a chain may pull chunks up to LOOKAHEAD bytes
    ahead into the same cache, so that the pass later uses them instead of reading
    again. After a checkpoint a chain is usually laid out right after (or just before)
    its DATA page, so a partition of big values is read once, in big reads; a chain
    elsewhere (a reused FREE page, another worker's page range) is read by ``pread``."""

    # Big sequential reads: one syscall per ~500 4 KiB pages, and the chunk stays a
    # ``bytes`` so that slicing it yields keys and values with a single copy.
    CHUNK = 1 << 21
    LOOKAHEAD = 16 << 20           # cache bound for chunks pulled ahead by chains

    def __init__(self, path: str, meta: Meta, start: int = 1, stop: int | None = None) -> None:
        self.path, self.meta = path, meta
        self.fd = os.open(path, os.O_RDONLY)
        self.size = os.fstat(self.fd).st_size
        ps = meta.page_size
        self.start = max(1, start)
        self.stop = meta.page_count if stop is None else min(stop, meta.page_count)
        self.per = max(1, self.CHUNK // ps)
        self.ahead = max(1, self.LOOKAHEAD // (self.per * ps))
        self.cache: dict[int, bytes] = {}
        self.cur = 0
        # pages that passed check_page (bounded by the file, not by a meta page count
        # that may be corrupt): a page is CRC-checked once, by the pass or by a chain
        self.checked = bytearray(min(meta.page_count, self.size // ps + 1))

    def close(self) -> None:
        os.close(self.fd)

    def _chunk(self, c: int) -> bytes:
        got = self.cache.get(c)
        if got is None:
            ps, first = self.meta.page_size, self.start + c * self.per
            n = min(self.per, self.stop - first)
            got = self.cache[c] = os.pread(self.fd, n * ps, first * ps)
        return got

    def chunk_of(self, i: int) -> tuple[int, bytes] | None:
        """(first page, bytes) of the chunk holding page ``i`` when it is in the
        window (the current chunk, the one before, or up to LOOKAHEAD ahead)."""
        if self.start <= i < self.stop:
            c = (i - self.start) // self.per
            if self.cur - 1 <= c <= self.cur + self.ahead:
                return self.start + c * self.per, self._chunk(c)
        return None

    def held(self, i: int) -> tuple[int, bytes]:
        """(first page, bytes) holding page ``i`` for a chain walk: its chunk when in
        the window and long enough, else a ``pread`` of the page alone (short at EOF)."""
        ps = self.meta.page_size
        got = self.chunk_of(i)
        if got is not None and (i - got[0] + 1) * ps <= len(got[1]):
            return got
        return i, os.pread(self.fd, ps, i * ps)

    def page(self, i: int) -> bytes | memoryview:
        ps = self.meta.page_size
        if self.start <= i < self.stop:
            c, j = divmod(i - self.start, self.per)
            if self.cur - 1 <= c <= self.cur + self.ahead:
                chunk = self._chunk(c)
                if (j + 1) * ps <= len(chunk):
                    return memoryview(chunk)[j * ps:(j + 1) * ps]
        return os.pread(self.fd, ps, i * ps)

    def chunks(self) -> Iterator[tuple[int, bytes]]:
        """(index of the first page, bytes of up to CHUNK of pages) for pages
        [start, stop); the last chunk of a truncated file is short (a partial page at
        its end is left to the caller)."""
        ps = self.meta.page_size
        for c, first in enumerate(range(self.start, self.stop, self.per)):
            self.cur = c
            for old in [k for k in self.cache if k < c - 1]:
                del self.cache[old]
            chunk = self._chunk(c)
            yield first, chunk
            if len(chunk) < min(self.per, self.stop - first) * ps:
                return


def truncation(r: PageReader) -> PageProblem | None:
    ps, count = r.meta.page_size, r.meta.page_count
    if r.size < count * ps:
        have = r.size // ps
        return PageProblem(have, have * ps, f"file truncated: {r.size} bytes, meta page count "
                                            f"{count} needs {count * ps}")
    return None


class RangeReader(PageReader):
    """A :class:`PageReader` over ONE page range whose bytes the caller already read
    (``body``: pages ``start..`` as they were when read), reporting every page it has
    to read from the file itself (overflow chains leaving the range) to
    ``seen(page, bytes)``. A caller decoding a file that is still being written (the
    transfer's streaming index) so knows exactly which page versions its items came
    from: the range's bytes, and each outside page's bytes as returned."""

    def __init__(self, path: str, meta: Meta, start: int, stop: int, body: bytes,
                 seen: Callable[[int, bytes], None]) -> None:
        super().__init__(path, meta, start, stop)
        self.per = max(1, self.stop - self.start)      # the whole range is chunk 0
        self.cache[0] = body
        self.seen = seen

    def _chunk(self, c: int) -> bytes:
        if c == 0:
            return self.cache[0]
        return b""            # nothing beyond the range is read as a chunk

    def held(self, i: int) -> tuple[int, bytes]:
        got = self.chunk_of(i)
        ps = self.meta.page_size
        if got is not None and (i - got[0] + 1) * ps <= len(got[1]):
            return got
        return i, self._outside(i)

    def page(self, i: int) -> bytes | memoryview:
        got = self.chunk_of(i)
        ps = self.meta.page_size
        if got is not None and (i - got[0] + 1) * ps <= len(got[1]):
            j = i - got[0]
            return memoryview(got[1])[j * ps:(j + 1) * ps]
        return self._outside(i)

    def _outside(self, i: int) -> bytes:
        b = os.pread(self.fd, self.meta.page_size, i * self.meta.page_size)
        self.seen(i, b)
        return b
