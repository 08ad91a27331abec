from __future__ import annotations

import os

import pytest

from validation import LayoutError, list_folders
from validation.layout import node_id, part_number
from validation_pages import entries, write_node, write_partition


def test_part_number_accepts_only_partition_files() -> None:
    assert part_number("part-0.bin") == 0
    assert part_number("part-63.bin") == 63
    for name in ("part-1.bin.tmp", "part-x.bin", "part-1.delta", "wal-1.bin", "part-.bin"):
        assert part_number(name) is None


def test_caches_layout_with_node_id_file(tmp_path) -> None:
    d = write_node(str(tmp_path / "data1"), "users", {0: entries(0, 3), 5: entries(5, 3)},
                   node_id="node-a")
    write_node(d, "orders", {2: entries(2, 3)})
    (tmp_path / "data1" / "caches" / "users" / "part-9.bin.tmp").write_bytes(b"junk")
    files = list_folders([d])
    assert [(f.node, f.cache, f.partition) for f in files] == [
        ("node-a", "orders", 2), ("node-a", "users", 0), ("node-a", "users", 5)]
    assert all(os.path.isabs(f.path) and f.size > 0 for f in files)


def test_flat_folder_is_cache_default_named_after_folder(tmp_path) -> None:
    flat = tmp_path / "n7"
    flat.mkdir()
    write_partition(str(flat / "part-3.bin"), 3, entries(3, 2))
    (f,) = list_folders([str(flat)])
    assert (f.node, f.cache, f.partition) == ("n7", "default", 3)


def test_empty_node_id_falls_back_to_folder_name(tmp_path) -> None:
    (tmp_path / "n1").mkdir()
    (tmp_path / "n1" / "node.id").write_text("  \n")
    assert node_id(str(tmp_path / "n1")) == "n1"


@pytest.mark.parametrize("case, message", [
    ("missing", "is not a directory"),
    ("empty", "holds no partition files"),
    ("duplicate", "both have node id"),
    ("none", "no data folders"),
])
def test_bad_folders_are_clear_errors(tmp_path, case, message) -> None:
    dirs: list[str]
    if case == "missing":
        dirs = [str(tmp_path / "nope")]
    elif case == "empty":
        (tmp_path / "e").mkdir()
        dirs = [str(tmp_path / "e")]
    elif case == "duplicate":
        a = write_node(str(tmp_path / "a"), "c", {0: entries(0, 1)}, node_id="same")
        b = write_node(str(tmp_path / "b"), "c", {0: entries(0, 1)}, node_id="same")
        dirs = [a, b]
    else:
        dirs = []
    with pytest.raises(LayoutError, match=message):
        list_folders(dirs)
