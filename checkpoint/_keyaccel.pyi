"""Types of the key index's C accelerator (``checkpoint/_keyaccel.c``); its callers use
it through :class:`checkpoint.keyindex.KeyAccel`. Columns are bytes of native u64."""
from array import array
from typing import Iterator, Sequence

from typing_extensions import Buffer

ABI_VERSION: int
MAX_LOAD_NUM: int
MAX_LOAD_DEN: int

def hash(key: Buffer, /) -> int: ...
def hash_items(items: list[tuple[bytes, int]], /) -> tuple[bytes, bytes]: ...
def page_hashes(pages: Sequence[tuple[int, int, int, list[tuple[int, bytes]]]], /
                ) -> tuple[bytes, bytes]: ...
def scan_pages(pages: Iterator[tuple[int, int, int, list[tuple[int, bytes]]]], limit: int,
               page_size: int, quarter: int, space: array[int], roomy: set[int],
               free_pages: list[int], /) -> tuple[bytes, bytes, bool]: ...
def place(src_h: Buffer, src_l: Buffer, start: int, shift: int, hashes: list[array[int]],
          locs: list[array[int]], masks: list[int], used: list[int], /) -> tuple[int, int] | None: ...
