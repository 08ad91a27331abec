"""The page layout module and the C header generated from it agree."""
from __future__ import annotations

import importlib.util
import os
import re
import struct

import pytest

from checkpoint import layout as L
from checkpoint.layout import parse_part_name, part_name

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _generator():
    spec = importlib.util.spec_from_file_location(
        "page_layout_h", os.path.join(ROOT, "scripts", "page_layout_h.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)   # type: ignore[union-attr]
    return mod


def test_committed_c_header_is_the_generated_one() -> None:
    gen = _generator()
    with open(gen.HEADER_PATH, encoding="utf-8") as f:
        committed = f.read()
    assert committed == gen.render(), \
        "csrc/ferry_page_layout.h is stale: run scripts/page_layout_h.py"


def _defines(path: str) -> dict[str, str]:
    with open(path, encoding="utf-8") as f:
        return dict(re.findall(r"^#define\s+(\w+)[ \t]+([^/\n]+?)\s*(?:/\*.*)?$", f.read(), re.M))


@pytest.mark.parametrize("source", ["_pageaccel.c", "_writeaccel.c"])
def test_accelerators_take_the_layout_from_the_header(source: str) -> None:
    """No page-layout number is defined in an accelerator itself: every layout name it
    defines is an alias of the generated header's."""
    path = os.path.join(ROOT, "checkpoint", source)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    assert '#include "ferry_page_layout.h"' in text
    layout_names = {"HDR", "ENTRY_SIZE", "OVF_ENTRY", "SLOT", "PTR_SIZE", "T_META", "T_DATA",
                    "T_OVF", "T_FREE", "F_TOMB", "F_OVF", "F_KNOWN", "MAX_VALUE",
                    "FORMAT_VERSION", "MAX_PAGE"}
    for name, value in _defines(path).items():
        if name in layout_names:
            assert value.startswith("FERRY_PG_"), f"{source}: {name} is {value}, not the header's"


def test_header_offsets_match_the_structs() -> None:
    fields = ("crc", "index", "type", "flags", "count", "aux")
    offsets = (L.OFF_CRC, L.OFF_INDEX, L.OFF_TYPE, L.OFF_FLAGS, L.OFF_COUNT, L.OFF_AUX)
    fmt = L.HEADER.format.lstrip("<")
    for i, (name, off) in enumerate(zip(fields, offsets)):
        assert struct.calcsize("<" + fmt[:i]) == off, name
    efmt = L.ENTRY.format.lstrip("<")
    for i, off in enumerate((L.E_FLAGS, L.E_KEY_LEN, L.E_VALUE_LEN, L.E_COUNTER)):
        assert struct.calcsize("<" + efmt[:i]) == off
    mfmt = ["8s", *L.META.format.lstrip("<8s")]        # one code per field
    moffs = (L.M_MAGIC, L.M_VERSION, L.M_RESERVED, L.M_PARTITION, L.M_PAGE_SIZE,
             L.M_PAGE_COUNT, L.M_COUNTER)
    for i, off in enumerate(moffs):
        assert struct.calcsize("<" + "".join(mfmt[:i])) == off


def test_named_header_and_meta() -> None:
    buf = L.encode_meta(7, 4096, 3, 99)
    assert L.crc_ok(buf)
    h = L.read_header(buf)
    assert (h.index, h.type, h.count, h.aux) == (0, L.PageType.META, 0, 0)
    m = L.decode_meta(buf)
    assert (m.magic, m.version, m.partition, m.page_size, m.page_count, m.counter) == \
        (L.MAGIC, L.FORMAT_VERSION, 7, 4096, 3, 99)
    L.set_count(buf, 513)
    L.set_aux(buf, 70000)
    assert (L.header_count(buf), L.header_aux(buf)) == (513, 70000)
    assert not L.crc_ok(buf)


@pytest.mark.parametrize("p", [0, 1, 12, 4095, 2**31])
def test_part_name_round_trip(p: int) -> None:
    assert part_name(p) == f"part-{p}.bin"
    assert parse_part_name(part_name(p)) == p


@pytest.mark.parametrize("name", ["part-1.bin.delta", "part-1.bin.ferry-tmp", "part-.bin",
                                  "part-x.bin", "xpart-1.bin", "part-1.bin\n", "wal"])
def test_parse_part_name_rejects_other_names(name: str) -> None:
    assert parse_part_name(name) is None
