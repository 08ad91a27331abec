"""Types of the page decoder's C accelerator (``checkpoint/_pageaccel.c``); its callers
use it through :class:`checkpoint.accel.PageAccel`."""
from array import array
from typing import Any, Callable

from typing_extensions import Buffer

ABI_VERSION: int
HW_CRC: int

def crc32c(data: Buffer, value: int = 0, /) -> int: ...
def use_hw(flag: object, /) -> bool: ...
def check_pages(buf: Buffer, first: int, page_size: int, j: int, /) -> int: ...
# items: Entry tuples, or (key, value) pairs when ``pairs``
def decode(chunk: Buffer, first: int, j: int, ps: int, checked: bytearray, tombstones: bool,
           pairs: bool, page_count: int, fetch: Callable[[int], tuple[int, bytes]], entry: type, /
           ) -> tuple[list[Any], int, BaseException | None]: ...
# the live pairs as column records (4 x int64 each) into ``chunk`` and a spill
def decode_live(chunk: Buffer, first: int, j: int, ps: int, checked: bytearray, page_count: int,
                fetch: Callable[[int], tuple[int, bytes]], /
                ) -> tuple[bytes, bytes, int, BaseException | None]: ...
def chain_value(page: int, length: int, ps: int, page_count: int, checked: bytearray,
                fetch: Callable[[int], tuple[int, bytes]], /) -> bytes | None: ...
def page_keys(chunk: Buffer, first: int, j: int, ps: int, /
              ) -> tuple[list[tuple[int, int, int, list[tuple[int, bytes]]]], int]: ...
# only when built with xxhash.h
def scan_keys(chunk: Buffer, first: int, j: int, ps: int, need: int, space: array[int],
              quarter: int, roomy: set[int], free_pages: list[int], /) -> tuple[bytes, bytes, int]: ...
