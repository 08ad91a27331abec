"""Live mode on the driver: read the partition map of a running cluster, plan the
executors' work, and say what each partition was compared at.

The map comes from any node of ``--cluster HOST:PORT[,...]`` (RPC ``get_map``), or
from the control plane: ``--control-plane URL`` lists the members in etcd
(``P/members/*``) and asks one of them. Only partitions with a primary and in-sync
copies are planned; the executors do the rest (validation.livesource). No partition
file is ever read on the driver.

Every connection of a validation (the driver's map, the executors' fences and file
fetches) is authenticated one of two ways, as the cluster's nodes are: the cluster
secret (``secret_file``: the validator is then a node to the cluster), or with
``tls`` (``transfer.tls.TlsFiles``: the cluster CA, a certificate and its key) mutual
TLS with a live validator's certificate, ``ferry://validator/NAME`` (``ferry certs
issue CA_DIR NAME --validator``), which may read the map, fence a partition for a
validation and fetch partition files, nothing else (node/rpcapi.py). A node's
certificate works too; a client's is refused before anything is asked.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .errors import (CertificateRefused, ClusterUnreachable, UnknownCache,  # noqa: F401 (re-exported)
                     ValidationError, WrongSecret)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from node import ClusterMap
    from node.control import EtcdAccess
    from transfer.tls import TlsContexts, TlsFiles

DEFAULT_PARALLEL = 4          # partitions fenced and fetched at once, cluster-wide
DEFAULT_RATE = 100_000_000    # bytes/s of validation transfers, cluster-wide
DEFAULT_PREFIX = "/ferry/default"


@dataclass
class LiveSettings:
    seeds: list[str] = field(default_factory=list)
    control_plane: list[str] = field(default_factory=list)
    prefix: str = DEFAULT_PREFIX
    secret_file: str | None = None
    caches: list[str] = field(default_factory=list)      # empty: every cache
    parallel: int = DEFAULT_PARALLEL
    rate: float | None = DEFAULT_RATE                    # None: unlimited
    tls: TlsFiles | None = None                          # mutual TLS instead of the secret
    etcd: EtcdAccess | None = None                       # how --control-plane reaches etcd


@dataclass
class LivePlan:
    """What the executors check: one dict per partition, grouped into tasks.
    ``secret_file`` is empty when ``tls`` (absolute paths) authenticates instead;
    ``members`` maps each member's RPC address to its node id (the id a node's TLS
    certificate must name at that address)."""
    settings: LiveSettings
    seeds: list[str]
    secret_file: str
    parts: list[dict]
    partition_counts: dict[str, int]
    epoch: int
    tls: TlsFiles | None = None
    members: dict[str, str] = field(default_factory=dict)

    def tasks(self, slots: int | None = None) -> list[dict]:
        """``parallel`` tasks; the rate limit is shared by the tasks that run at once:
        ``min(tasks, slots)``, where ``slots`` is how many the Spark cluster runs at
        once (``defaultParallelism``; None: as many as there are tasks). Divided by the
        planned tasks alone, 2 executor cores running 2 of 4 tasks got half the rate."""
        n = max(1, min(self.settings.parallel, len(self.parts)))
        groups: list[list[dict]] = [[] for _ in range(n)]
        for i, part in enumerate(self.parts):
            groups[i % n].append(part)
        running = min(n, slots) if slots and slots > 0 else n
        rate = self.settings.rate / running if self.settings.rate else None
        tls = None if self.tls is None else {"ca": self.tls.ca, "cert": self.tls.cert, "key": self.tls.key}
        return [{"parts": g, "seeds": self.seeds, "secret_file": self.secret_file, "rate": rate,
                 "tls": tls, "members": self.members}
                for g in groups if g]

    def files(self) -> list[str]:
        """The files every executor needs: the secret, or the three TLS files."""
        if self.tls is not None:
            return [self.tls.ca, self.tls.cert, self.tls.key]
        return [self.secret_file]


def _secret_file(s: LiveSettings) -> str:
    path = s.secret_file or os.environ.get("FERRY_SECRET_FILE")
    if not path:
        raise ValidationError("live validation needs the cluster secret: give --secret-file FILE (or, "
                              "on a cluster with mutual TLS, --tls-ca, --tls-cert and --tls-key)")
    if not os.path.isfile(path):
        raise ValidationError(f"secret file {path} does not exist")
    return os.path.abspath(path)


def _tls_files(s: LiveSettings) -> "TlsFiles":
    """``s.tls`` with absolute paths (an executor may run elsewhere), checked: the three
    files load, and the certificate is a validator's (or a node's)."""
    from transfer.tls import CLIENT, TlsFiles
    assert s.tls is not None
    files = TlsFiles(*(os.path.abspath(p) for p in (s.tls.ca, s.tls.cert, s.tls.key)))
    me = _contexts(files).identity
    if me.role == CLIENT:
        raise CertificateRefused(
            f"certificate {files.cert} is for {me}: a client certificate may not fence or fetch "
            "partitions. Live validation needs a validator certificate (ferry://validator/NAME: "
            "ferry certs issue CA_DIR NAME --validator)")
    return files


def _contexts(files: "TlsFiles") -> "TlsContexts":
    from transfer.tls import TlsContexts, TlsError
    try:
        return TlsContexts(files)
    except TlsError as exc:
        raise CertificateRefused(f"cannot use the TLS files of --tls-ca/--tls-cert/--tls-key: "
                                 f"{exc.reason}") from exc


ETCD_HINT = ("ferry validate reaches an etcd with TLS or access control with --etcd-ca, "
             "--etcd-cert, --etcd-key, --etcd-user and --etcd-password-file, or $FERRY_ETCD_*; "
             "the cluster's read-only user, ferry-NAME-reader, is enough")


def _members_from_etcd(endpoints: list[str], prefix: str, access: "EtcdAccess | None" = None) -> list[str]:
    """The RPC addresses of the live members under ``prefix`` (a read of
    ``P/members/``: the read-only role of ``ferry etcd setup`` may do it). ``access``
    None: the environment's ``FERRY_ETCD_*``."""
    from node import Etcd
    from node.control import ControlPlaneAccessError
    from node.errors import ControlPlaneError, ControlPlaneTLSError
    try:
        _, kvs = Etcd(endpoints, access=access).range_prefix(prefix.rstrip("/") + "/members/")
    except (ControlPlaneTLSError, ControlPlaneAccessError, ControlPlaneError) as exc:
        # TLS refused, no or wrong credentials, permission denied: a setup error, said once
        raise ClusterUnreachable(f"control plane {','.join(endpoints)} refused the read of "
                                 f"{prefix.rstrip('/')}/members/: {exc} ({ETCD_HINT})") from exc
    except Exception as exc:  # noqa: BLE001 - the etcd client raises its own and OS errors
        raise ClusterUnreachable(f"control plane {','.join(endpoints)} unreachable: {exc}") from exc
    out = [kv.value.get("address") for kv in kvs.values() if isinstance(kv.value, dict)]
    seeds = [a for a in out if isinstance(a, str) and a]
    if not seeds:
        raise ClusterUnreachable(f"control plane {','.join(endpoints)} lists no live member under "
                                 f"{prefix}/members/ (wrong --prefix, or no node running)")
    return seeds


def read_map(settings: LiveSettings) -> tuple["ClusterMap", list[str], str, "TlsFiles | None"]:
    """(map, seeds, secret file, TLS files) of the cluster, or a ValidationError that
    says why not. With ``settings.tls`` the secret file is empty (not read)."""
    from node.rpcapi import fetch_map
    from node import AuthFailed, NodeError
    from node import Pool, load_secret

    tls: TlsFiles | None = None
    if settings.tls is not None:
        tls = _tls_files(settings)
        secret_file = ""
        pool = Pool(b"", role="node", timeout=5.0, tls=_contexts(tls))
    else:
        secret_file = _secret_file(settings)
        try:
            secret = load_secret(secret_file)
        except AuthFailed as exc:
            raise ValidationError(f"cannot use secret file {secret_file}: {exc}") from exc
        pool = Pool(secret, role="node", timeout=5.0)
    try:
        seeds = list(settings.seeds)
        if settings.control_plane:
            seeds += [a for a in _members_from_etcd(settings.control_plane, settings.prefix, settings.etcd)
                      if a not in seeds]
        if not seeds:
            raise ValidationError("give --cluster HOST:PORT[,...] or --control-plane URL")
        errors = []
        for seed in seeds:
            try:
                return fetch_map(pool, seed, timeout=None), seeds, secret_file, tls
            except AuthFailed as exc:
                if tls is not None:
                    raise CertificateRefused(f"mutual TLS with node {seed} failed, nothing was asked: {exc} "
                                             f"(the validator's CA {tls.ca}, certificate {tls.cert})") from exc
                raise WrongSecret(f"node {seed} refused the secret in {secret_file}: it is not "
                                  f"this cluster's secret ({exc})") from exc
            except NodeError as exc:
                errors.append(f"{seed}: {exc}")
    finally:
        pool.close()
    raise ClusterUnreachable("no node of the cluster answers: " + "; ".join(errors))


def plan(settings: LiveSettings) -> LivePlan:
    m, seeds, secret_file, tls = read_map(settings)
    known = sorted(m.caches)
    for c in settings.caches:
        if c not in m.caches:
            raise UnknownCache(f"the cluster has no cache {c!r}; its caches: {', '.join(known)}")
    parts = []
    for cache in settings.caches or known:
        for p, rec in enumerate(m.parts[cache]):
            if rec.primary is None or not rec.isr:
                continue            # no primary now: reported by `cluster status` as lost
            parts.append({"cache": cache, "partition": p, "primary": rec.primary,
                          "address": m.address(rec.primary) or "", "term": rec.term})
    live = [a.address for a in m.members.values() if a.alive]
    members = {a.address: n for n, a in m.members.items() if a.address}
    return LivePlan(settings, live or seeds, secret_file, parts,
                    {c: m.caches[c].partitions for c in known}, m.epoch, tls, members)


def read_raw(spark: "SparkSession", live: LivePlan) -> "DataFrame":
    """Raw rows (``livesource.LIVE_SCHEMA``) of every planned partition."""
    from .livesource import SOURCE_NAME, LiveDataSource
    from .session import is_local

    spark_master = spark.sparkContext.master
    assert spark_master is not None              # a SparkContext does not start without one
    if not is_local(spark_master):
        _ship(spark, live.files())
    spark.dataSource.register(LiveDataSource)
    slots = spark.sparkContext.defaultParallelism
    return (spark.read.format(SOURCE_NAME).option("tasks", json.dumps(live.tasks(slots))).load())


def _ship(spark: "SparkSession", paths: list[str]) -> None:
    """Executors on other hosts find the secret (or the TLS files) through SparkFiles
    (no shared storage), by the file's name: two files of one name cannot both go."""
    sc = spark.sparkContext
    shipped: set[str] = getattr(sc, "_ferry_secrets", set())
    for path in paths:
        if path not in shipped:
            sc.addFile(path)
            shipped.add(path)
    sc._ferry_secrets = shipped  # type: ignore[attr-defined]


def summary(states: list, plan_: LivePlan) -> dict:
    """The ``live`` object of the report: the counter each partition was compared at,
    each copy's node and snapshot counter, and the copies that could not be checked."""
    parts, unchecked, mismatched = [], [], []
    for s in states:
        ats = {r.at for r in s.replicas.values() if r.at is not None}
        copies = {n: {"snapshot": r.snapshot} for n, r in sorted(s.replicas.items())
                  if r.error is None}
        at = min(ats) if ats else None
        parts.append({"cache": s.cache, "partition": s.partition, "counter": at, "copies": copies})
        for n, r in sorted(s.replicas.items()):
            if r.error is not None:
                unchecked.append({"cache": s.cache, "partition": s.partition,
                                  "node": n or None, "reason": r.error})
            elif at is not None and r.snapshot != at:
                mismatched.append({"cache": s.cache, "partition": s.partition, "node": n,
                                   "counter": at, "snapshot": r.snapshot})
    return {"epoch": plan_.epoch, "partitions": parts, "unchecked": unchecked,
            "counter_mismatch": mismatched}
