"""Where partition files are: the node data folder layout, listed on the driver.

A node data folder ``DATA`` holds ``DATA/caches/<cache>/part-<p>.bin``; the node id
is the contents of ``DATA/node.id`` when present, else the folder's basename. A
folder that directly contains ``part-<p>.bin`` files is accepted too, as the cache
``default`` of a node named after the folder.

Only paths and sizes are listed here (the driver never opens a partition file);
the files are decoded inside Spark's executors by :mod:`validation.source`.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass

from checkpoint.layout import parse_part_name, part_name

from .errors import LayoutError

# The partition column is a Spark int; no cluster has nearly that many partitions.
MAX_PARTITION = 2**31 - 1
CACHES_DIR = "caches"
NODE_ID_FILE = "node.id"
DEFAULT_CACHE = "default"


@dataclass(frozen=True)
class PartitionFile:
    """One partition file of one node: the unit of decoding work."""
    node: str
    cache: str
    partition: int
    path: str
    size: int
    # Why the file is not decoded (a partition number out of range, a name that is
    # not the partition's file name): reported as a finding of the run.
    problem: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def part_number(name: str) -> int | None:
    """``part-12.bin`` -> 12; anything else (temp files, deltas) -> None."""
    return parse_part_name(name)


def node_id(data_dir: str) -> str:
    path = os.path.join(data_dir, NODE_ID_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            ident = f.read().strip()
    except FileNotFoundError:
        ident = ""
    except OSError as exc:
        raise LayoutError(f"cannot read node id {path}: {exc.strerror}") from exc
    # An empty node.id would merge this node with every other unnamed one: fall
    # back to the folder name, which is unique among the folders given.
    return ident or os.path.basename(os.path.abspath(data_dir).rstrip(os.sep))


def _part_files(node: str, cache: str, folder: str) -> list[PartitionFile]:
    out = []
    for entry in os.scandir(folder):
        p = part_number(entry.name)
        if p is not None and entry.is_file():
            out.append(PartitionFile(node, cache, p, os.path.abspath(entry.path),
                                     entry.stat().st_size, _name_problem(entry.name, p)))
    return out


def _name_problem(name: str, p: int) -> str | None:
    """Why ``name`` (which parses as partition ``p``) is not decoded, or None."""
    if p > MAX_PARTITION:
        return (f"file name {name}: partition number {p} is above {MAX_PARTITION}, so it is "
                "no partition of any cluster; the file was not decoded (move it out of the "
                "folder)")
    if name != part_name(p):
        return (f"file name {name} is not the name of partition {p}'s file ({part_name(p)}); "
                "the file was not decoded (rename it or move it out of the folder)")
    return None


def list_folder(data_dir: str) -> list[PartitionFile]:
    """The partition files of one node data folder (either layout)."""
    if not os.path.isdir(data_dir):
        raise LayoutError(f"{data_dir} is not a directory; give node data folders "
                          f"(DATA/caches/<cache>/part-<p>.bin) or folders of part-<p>.bin files")
    node = node_id(data_dir)
    files: list[PartitionFile] = []
    caches = os.path.join(data_dir, CACHES_DIR)
    try:
        if os.path.isdir(caches):
            for entry in sorted(os.scandir(caches), key=lambda e: e.name):
                if entry.is_dir():
                    files.extend(_part_files(node, entry.name, entry.path))
        files.extend(_part_files(node, DEFAULT_CACHE, data_dir))
    except OSError as exc:
        raise LayoutError(f"cannot list {data_dir}: {exc.strerror}") from exc
    if not files:
        raise LayoutError(f"{data_dir} holds no partition files (looked for "
                          f"{CACHES_DIR}/<cache>/part-<p>.bin and part-<p>.bin)")
    return sorted(files, key=lambda f: (f.cache, f.partition))


def list_folders(data_dirs: list[str]) -> list[PartitionFile]:
    """The partition files of several node folders; two folders claiming the same
    node id are refused, since their files would be compared as one replica."""
    if not data_dirs:
        raise LayoutError("no data folders given")
    files: list[PartitionFile] = []
    seen: dict[str, str] = {}
    for d in data_dirs:
        found = list_folder(d)
        node = found[0].node
        if node in seen:
            raise LayoutError(f"{d} and {seen[node]} both have node id {node!r}; "
                              f"give each folder a distinct {NODE_ID_FILE}")
        seen[node] = d
        files.extend(found)
    return files
