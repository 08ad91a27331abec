"""The file-move driver's two processes: a supplier (a partition store under the
harness's writes, serving files with transfer.SupplierServer) and a demander that moves
partitions file-based (MOVING + temp WAL, DEMAND, install, index rebuild, replay,
checkpoint, OWNING) and resumes after a crash at any point.

This is the flow of ``ferry demo`` with what the demo lacks for a crash harness:
durable move states, restart recovery, re-sync of stale copies, and the harness as the
client that keeps the model of acknowledged writes. When node/ moves partitions
file-based (issue 7), the ``cluster`` scenarios reach the same crash points in nodes.

Run as ``python -m cluster_sim.mover.supplier`` / ``python -m cluster_sim.mover.demander``.
"""
