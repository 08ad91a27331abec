"""The crash-point simulation harness and partition-testing tool: scenarios, a seeded
workload with a model of acknowledged writes, real processes on loopback with their own
etcd, crash plans, network partitions (peers, control plane, both, flapping), etcd
member loss, invariants, a time budget per run, matrices and reports.
Documentation: docs/harness.md.

Public face:
- :class:`Scenario` and its parts, :func:`load_scenario`, :data:`BUILTINS`
- :func:`run` -> :class:`RunResult`; :func:`run_matrix` -> :class:`MatrixResult`
- :class:`Model`, :func:`generate` (the seeded workload)
- :class:`Proxy` (loopback network faults; on the cluster's RPC links with ``proxy = true``
  and in front of etcd per node for ``cut-control``/``isolate``/``flap``)
- disk full: :class:`DiskSpec`, :mod:`cluster_sim.diskfull` (a node's data dir on a tmpfs)
- errors: :class:`SimError`, :class:`ScenarioError`, :class:`ProcessError`
"""
from __future__ import annotations

from .builtins import BUILTINS
from .errors import ProcessError, ScenarioError, SimError
from .netproxy import Proxy
from .runner import RunResult, run
from .scenario import CacheSpec, CrashPlan, DiskSpec, Event, IndexSpec, Scenario, WorkloadSpec
from .builtins import load as load_scenario
from .workload import Model, generate

__all__ = ["Scenario", "CacheSpec", "IndexSpec", "WorkloadSpec", "Event", "CrashPlan", "DiskSpec",
           "load_scenario", "BUILTINS", "run", "RunResult", "Model", "generate", "Proxy",
           "SimError", "ScenarioError", "ProcessError"]
