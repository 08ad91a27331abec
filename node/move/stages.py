"""The stages of one partition move, by name: the one vocabulary of code, logs
(``stage=<value>``), the ``ferry_node_moves_by_stage`` metric's label, ``ferry cluster
status`` and the demo's progress.

The values are the strings the node has always shown, so logs, metrics, status JSON
and ``moves_done`` read as before (``Stage.INDEX_REBUILD == "index rebuild"``).
"""
from __future__ import annotations

from enum import Enum


class Stage(str, Enum):
    PREPARE = "prepare"                  # p -> MOVING, fresh temp WAL
    DEMAND = "demand"                    # register with the primary: buffer before snapshot
    TRANSFER = "transfer"                # the file travels (transfer.Demander.fetch)
    INSTALL = "install"                  # verified file renamed into place
    INDEX_REBUILD = "index rebuild"      # LMDB indexes from the installed file
    REPLAY = "replay"                    # temp WAL applied, tail switch to the direct path
    CHECKPOINT_WAIT = "checkpoint wait"  # a checkpoint covering it all, primary confirmed
    OWNING = "owning"                    # the gate passed
    # the messages mode (fallback and baseline)
    FETCH = "fetch"                      # supply batches of entries
    CATCHUP = "catchup"                  # the buffered updates after the supplied entries

    def __str__(self) -> str:           # "%s" in a log line shows the value, not Stage.X
        return self.value


# in order: the files mode's stages before OWNING, then the messages mode's own
FILE_STAGES: tuple[Stage, ...] = (Stage.PREPARE, Stage.DEMAND, Stage.TRANSFER, Stage.INSTALL,
                                  Stage.INDEX_REBUILD, Stage.REPLAY, Stage.CHECKPOINT_WAIT)
STAGES: tuple[Stage, ...] = FILE_STAGES + (Stage.FETCH, Stage.CATCHUP)
