"""The file-move driver's two processes: a supplier (a partition store under the
harness's writes, serving files with transfer.SupplierServer) and a demander that hosts
the node's move engine (:mod:`node.move`: MOVING + temp WAL, DEMAND, install, index
rebuild, replay, checkpoint wait, OWNING, the node's crash points) and resumes after a
crash at any point.

The demander adds what a crash harness needs around the engine: durable move states
(``moves.json``), restart recovery and re-sync of stale copies; the harness is the
client that keeps the model of acknowledged writes.

Run as ``python -m cluster_sim.mover.supplier`` / ``python -m cluster_sim.mover.demander``.
"""
