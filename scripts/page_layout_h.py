#!/usr/bin/env python3
"""Generate ``csrc/ferry_page_layout.h`` from ``checkpoint/layout.py``.

The C accelerators (checkpoint/_pageaccel.c, _writeaccel.c) read and write the page
layout; their numbers come from this header and the header comes from the Python
layout module, so a constant changes in one place for both.

    scripts/page_layout_h.py           rewrite the header
    scripts/page_layout_h.py --check   exit 1 when the committed header is stale

tests/checkpoint/test_layout.py runs the check, so a layout change that was not
regenerated fails the tests.
"""
from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER_PATH = os.path.join(ROOT, "csrc", "ferry_page_layout.h")


def render() -> str:
    """The header's text, from the layout module of this checkout."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from checkpoint import layout as L

    def c_string(b: bytes) -> str:
        return '"' + "".join(chr(c) if 32 <= c < 127 and c not in b'"\\' else f"\\{c:o}"
                             for c in b) + '"'

    rows: list[tuple[str, str, str]] = [
        ("FERRY_PG_FORMAT_VERSION", str(L.FORMAT_VERSION), "meta page: format version"),
        ("FERRY_PG_MAGIC", c_string(L.MAGIC), "meta page: first 8 bytes of the body"),
        ("FERRY_PG_MAGIC_LEN", str(len(L.MAGIC)), ""),
        ("FERRY_PG_MIN_PAGE", str(L.MIN_PAGE_SIZE), "page sizes: powers of two in MIN..MAX"),
        ("FERRY_PG_MAX_PAGE", str(L.MAX_PAGE_SIZE), "slot offsets are u16"),
        ("FERRY_PG_MAX_VALUE", f"{L.MAX_VALUE}u", "largest value (overflow chains)"),
        ("FERRY_PG_HDR", str(L.HDR), "page header: crc u32 | index u32 | type u8 | flags u8 "
                                     "| count u16 | aux u32"),
        ("FERRY_PG_OFF_CRC", str(L.OFF_CRC), ""),
        ("FERRY_PG_OFF_INDEX", str(L.OFF_INDEX), ""),
        ("FERRY_PG_OFF_TYPE", str(L.OFF_TYPE), ""),
        ("FERRY_PG_OFF_FLAGS", str(L.OFF_FLAGS), ""),
        ("FERRY_PG_OFF_COUNT", str(L.OFF_COUNT), "DATA: slots; OVERFLOW: payload bytes"),
        ("FERRY_PG_OFF_AUX", str(L.OFF_AUX), "DATA: heap start; OVERFLOW: next page"),
        ("FERRY_PG_CRC_FROM", str(L.CRC_FROM), "the CRC covers [CRC_FROM, page_size)"),
        ("FERRY_PG_SLOT", str(L.SLOT.size), "a slot: u16 entry offset, 0 = empty"),
        ("FERRY_PG_PTR", str(L.PTR.size), "first overflow page u32"),
        ("FERRY_PG_ENTRY", str(L.ENTRY.size), "entry: flags u8 | key_len u16 | value_len u32 "
                                              "| counter u64"),
        ("FERRY_PG_OVF_ENTRY", str(L.OVF_ENTRY), "... | key | first_overflow_page u32"),
        ("FERRY_PG_E_FLAGS", str(L.E_FLAGS), ""),
        ("FERRY_PG_E_KEY_LEN", str(L.E_KEY_LEN), ""),
        ("FERRY_PG_E_VALUE_LEN", str(L.E_VALUE_LEN), ""),
        ("FERRY_PG_E_COUNTER", str(L.E_COUNTER), ""),
        ("FERRY_PG_M_MAGIC", str(L.M_MAGIC), "meta fields, from the end of the header"),
        ("FERRY_PG_M_VERSION", str(L.M_VERSION), ""),
        ("FERRY_PG_M_PARTITION", str(L.M_PARTITION), ""),
        ("FERRY_PG_M_PAGE_SIZE", str(L.M_PAGE_SIZE), ""),
        ("FERRY_PG_M_PAGE_COUNT", str(L.M_PAGE_COUNT), ""),
        ("FERRY_PG_M_COUNTER", str(L.M_COUNTER), ""),
    ]
    rows += [(f"FERRY_PG_T_{t.name}", str(int(t)), "page type") for t in L.PageType]
    rows += [(f"FERRY_PG_F_{f.name}", str(int(f)), "entry flag") for f in L.EntryFlag]
    rows.append(("FERRY_PG_F_KNOWN", str(L.KNOWN_FLAGS), "every entry flag"))
    width = max(len(name) for name, _v, _c in rows) + 1
    lines = [
        "/* The partition page file layout, for the C accelerators.",
        " *",
        " * GENERATED from checkpoint/layout.py by scripts/page_layout_h.py: do not edit;",
        " * change the layout module and regenerate (tests/checkpoint/test_layout.py",
        " * fails while this file is stale). The format: docs/formats.md. */",
        "#ifndef FERRY_PAGE_LAYOUT_H",
        "#define FERRY_PAGE_LAYOUT_H",
        "",
    ]
    for name, value, comment in rows:
        text = f"#define {name.ljust(width)}{value}"
        lines.append(f"{text.ljust(48)}/* {comment} */" if comment else text)
    lines += ["", "#endif"]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if argv[1:] == ["--check"]:
        try:
            with open(HEADER_PATH, encoding="utf-8") as f:
                same = f.read() == text
        except FileNotFoundError:
            same = False
        if not same:
            print(f"{HEADER_PATH} is stale: run scripts/page_layout_h.py", file=sys.stderr)
        return 0 if same else 1
    if argv[1:]:
        print(__doc__, file=sys.stderr)
        return 2
    with open(HEADER_PATH + ".tmp", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(HEADER_PATH + ".tmp", HEADER_PATH)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
