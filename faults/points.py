"""Every crash point of Ferry, by name, with what is and is not durable there.

A crash point is one line at its site: ``crashpoint("demander.mid_replay")``. Names are
``<component>.<stage>``. This module is the only list; a test fails when a name is
listed but never reached by any scenario, or reached in code but missing here.

The ``demander.*`` points of a move are marked once, in the move engine
(``node/move/engine.py``, ``node/move/messages.py``; ``mid_receive``,
``mid_delta_receive``, ``mid_base_copy`` and ``before_install`` in ``transfer/``), which
the node hosts; every crash cell of the harness runs real ``ferry node`` processes.
"""
from __future__ import annotations

POINTS: dict[str, str] = {
    # -- write-ahead log ----------------------------------------------------------
    "wal.before_sync": "Records are written to the segment file but not fsynced: none of "
                       "them is acknowledged; any prefix of them may survive a power cut.",
    "wal.after_sync": "Records are fsynced but their appenders have not been told: they are "
                      "durable yet unacknowledged; recovery must keep them (never a hole).",
    # -- checkpointer -------------------------------------------------------------
    "checkpoint.mid_write": "Some dirty pages of the cut are written to partition files, "
                            "others not, no fsync, no marker: recovery rolls the files back "
                            "to the previous marker with the undo images in the WAL "
                            "and replays from its mark.",
    # -- supplier -----------------------------------------------------------------
    "supplier.after_snapshot": "A transfer snapshot (counter C) is open and its delta file "
                               "exists; nothing is sent. The delta is removed at restart.",
    "supplier.mid_send": "Part of the file is on the wire; the demander holds verified "
                         "chunks durably and resumes from them.",
    "supplier.mid_delta_send": "A delta fetch: some ranges of changed pages are on the "
                               "wire; the demander's temp file holds its base and part of "
                               "them, nothing installed; it demands again (a new delta).",
    "supplier.mid_preimages": "All file data is sent, pre-images partly: the demander has "
                              "not installed anything and re-demands.",
    # -- demander -----------------------------------------------------------------
    "demander.after_demand": "The partition is MOVING and its temp WAL is set up (buffering "
                             "started before the DEMAND; on disk from the first buffered "
                             "update); nothing received yet.",
    "demander.mid_base_copy": "A delta fetch takes the digests of its base, per 4 MiB: this "
                              "node's older copy handed over as the temp file (a node's "
                              "move; the restart's fetch takes the temp file as its base "
                              "again) or copied into it (the installed copy untouched).",
    "demander.mid_delta_receive": "A delta fetch received some ranges into the temp file "
                                  "over its base; nothing recorded for resume, nothing "
                                  "installed: the restart demands a new delta.",
    "demander.mid_receive": "A temp file with some verified chunks and their durable "
                            "record; nothing installed. (Messages mode: some supply "
                            "batches applied to the MOVING partition; the restart drops "
                            "p and starts the move over.)",
    "demander.mid_stream_index": "The streaming install decoded a page range of the temp "
                                 "file into index keys held in memory only (LMDB untouched); "
                                 "as at mid_receive: the restart starts the move over.",
    "demander.mid_index_receive": "A shipped index (rebalance.index_transfer = ship) is "
                                  "partly received from the supplier, in memory only (LMDB "
                                  "untouched); the file is installed: the restart starts the "
                                  "move over.",
    "demander.before_install": "The received file is complete and verified in its temp "
                               "file, fsynced, not yet renamed into place.",
    "demander.after_install": "part-<p>.bin is installed and the directory fsynced; "
                              "indexes not rebuilt, temp WAL not replayed.",
    "demander.mid_index_rebuild": "Index entries partly written; the partition's ready "
                                  "marker is absent, so the rebuild restarts clean.",
    "demander.mid_index_load": "Entries of a shipped index partly written; the partition's "
                               "ready marker is absent (written only after every check), "
                               "so the restart's move rebuilds or loads it again from clear.",
    "demander.mid_replay": "The temp WAL is partly applied; replay is idempotent by "
                           "update counter and restarts from the beginning.",
    "demander.before_owning": "Everything replayed and checkpointed, state still MOVING: "
                              "the gate is re-checked on restart.",
    "demander.after_owning": "OWNING is durable; the temp WAL may still exist and is "
                             "deleted at restart.",
    # -- old owner ----------------------------------------------------------------
    "owner.mid_eviction": "The partition is RENTING/EVICTED in the map but its file is "
                          "not yet deleted; deletion resumes at restart.",
}


def describe(name: str) -> str:
    return POINTS[name]
