"""``ferry node ...`` (run a node) and ``ferry cluster ...`` (status and data operations).

Imports only click at module level; the node machinery is imported inside commands.
"""
from __future__ import annotations

import json
import sys

import click


class InputError(click.ClickException):
    """Bad input (a config value, a flag, an argument): one line, exit status 2 like
    click's own usage errors, so scripts can tell it from a failure of the cluster (1)."""

    exit_code = 2


def _text(what: str, value: str) -> str:
    """``value`` as the UTF-8 text it is sent as. Arguments that are not UTF-8 arrive
    from click as str with surrogate escapes, which cannot be encoded."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        try:
            bad = f"byte 0x{value[e.start].encode('utf-8', 'surrogateescape')[0]:02x}"
        except UnicodeEncodeError:
            bad = f"code point U+{ord(value[e.start]):04X}"
        raise InputError(f"{what} is not UTF-8 text ({bad} at character {e.start}); "
                         "ferry cluster takes UTF-8 text: use node.Client for binary keys and "
                         "values") from None
    return value


@click.group("node")
def node() -> None:
    """Run a storage node."""


@node.command("start")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="TOML config file.")
@click.option("--id", "node_id", help="Node id (letters, digits, _ . -).")
@click.option("--data", type=click.Path(file_okay=False), help="Data directory.")
@click.option("--listen", help="HOST:PORT to serve on.")
@click.option("--advertise", help="HOST:PORT others use to reach this node (default: --listen).")
@click.option("--control-plane", "control_plane", multiple=True,
              help="etcd client URL(s) of the control plane, comma-separated or repeated "
                   "(http://127.0.0.1:2379). The first node registered creates the cluster.")
@click.option("--lease-ttl", "lease_ttl_s", type=int, help="Control-plane lease TTL in seconds (>= 2).")
@click.option("--secret-file", type=click.Path(dir_okay=False), help="File holding the cluster secret.")
@click.option("--metrics-listen", help="HOST:PORT for Prometheus metrics (/metrics).")
@click.option("--partitions", type=int, help="Partitions of the default cache (no [[caches]] in the file).")
@click.option("--backups", type=int, help="Backups of the default cache (no [[caches]] in the file).")
@click.option("--log-level", help="DEBUG, INFO, WARNING ...")
@click.option("--transfer-listen", help="HOST:PORT of the file supplier (default: listen host, any port).")
@click.option("--rebalance-mode", type=click.Choice(["files", "messages"]), help="Rebalancing mode (default files).")
@click.option("--initial-members", "initial_members", multiple=True,
              help="Node ids a NEW cluster starts with, comma-separated or repeated: each creates "
                   "its own share of the partitions, so nothing moves at start ([cluster] initial_members).")
def start(config_path: str | None, node_id: str | None, data: str | None, listen: str | None,
          advertise: str | None, control_plane: tuple[str, ...], lease_ttl_s: int | None,
          secret_file: str | None,
          metrics_listen: str | None, partitions: int | None, backups: int | None,
          log_level: str | None, transfer_listen: str | None, rebalance_mode: str | None,
          initial_members: tuple[str, ...]) -> None:
    """Start a node; it runs until SIGTERM (graceful) or SIGINT."""
    from .errors import NodeError
    from .process import run
    from . import config as cfgmod
    try:
        cfg = cfgmod.load(config_path, id=node_id, data=data, listen=listen, advertise=advertise,
                          control_plane=tuple(u for x in control_plane for u in x.split(",") if u),
                          lease_ttl_s=lease_ttl_s, secret_file=secret_file, metrics_listen=metrics_listen,
                          log_level=log_level, transfer_listen=transfer_listen,
                          rebalance_mode=rebalance_mode,
                          initial_members=tuple(n for x in initial_members for n in x.split(",") if n))
        if partitions is not None or backups is not None:
            if cfg.source and len(cfg.caches) != 1:
                raise cfgmod.ConfigError("--partitions/--backups apply to a single cache only")
            c = cfg.caches[0]
            from dataclasses import replace
            # `partitions or ...` once turned --partitions 0 into the default 64
            c = replace(c, partitions=c.partitions if partitions is None else partitions,
                        backups=c.backups if backups is None else backups)
            try:
                cfg = cfgmod.with_overrides(cfg, caches=(c,))
            except cfgmod.ConfigError as e:
                raise cfgmod.ConfigError(f"--partitions/--backups: {e}") from None
    except NodeError as e:
        raise InputError(str(e)) from None
    sys.exit(run(cfg))


@click.group("cluster")
def cluster() -> None:
    """Cluster status and data operations."""


_seed = click.option("--seed", required=True, multiple=True, help="HOST:PORT of any node (repeatable).")
_secret = click.option("--secret-file", type=click.Path(dir_okay=False), help="Cluster secret file (or $FERRY_SECRET).")


def _fail(e: Exception) -> None:
    # the request itself is wrong (bad argument, too large, unknown cache): exit 2
    if getattr(e, "code", None) in ("bad_request", "too_large", "config"):
        raise InputError(str(e))
    raise click.ClickException(str(e))


@cluster.command("status")
@_seed
@_secret
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (schema in docs/node.md).")
@click.option("--partitions", "all_partitions", is_flag=True,
              help="A row for every partition (by default, past 64, only those not settled).")
@click.option("--partition", "one", metavar="CACHE/P", help="Only this partition (table and --json).")
def status_cmd(seed: tuple[str, ...], secret_file: str | None, as_json: bool, all_partitions: bool,
               one: str | None) -> None:
    """Nodes, topology version, partition states and moves in progress."""
    from .errors import NodeError
    from .status import collect, render, select
    from .wire import Pool, load_secret
    try:
        pool = Pool(load_secret(secret_file), role="client")
        last: Exception | None = None
        for s in seed:
            try:
                doc = collect(pool, s)
                break
            except NodeError as e:
                last = e
        else:
            raise last  # type: ignore[misc]
    except NodeError as e:
        _fail(e)
    if one is not None:
        try:
            doc = select(doc, one)
        except KeyError:
            raise click.BadParameter(f"no partition {one!r} (CACHE/P, e.g. default/3)", param_hint="--partition")
    click.echo(json.dumps(doc, indent=1) if as_json else render(doc, all_partitions=all_partitions))


def _client(seed: tuple[str, ...], secret_file: str | None):  # type: ignore[no-untyped-def]
    from .client import Client
    return Client(list(seed), secret_file=secret_file)


@cluster.command("put")
@_seed
@_secret
@click.option("--cache", default="default", show_default=True)
@click.argument("key")
@click.argument("value")
def put_cmd(seed: tuple[str, ...], secret_file: str | None, cache: str, key: str, value: str) -> None:
    """Store VALUE under KEY (UTF-8); prints the update counter once acknowledged."""
    from .errors import NodeError
    cache, key, value = _text("--cache", cache), _text("KEY", key), _text("VALUE", value)
    try:
        with _client(seed, secret_file) as c:
            click.echo(f"ok counter={c.put(cache, key, value)}")
    except NodeError as e:
        _fail(e)


@cluster.command("get")
@_seed
@_secret
@click.option("--cache", default="default", show_default=True)
@click.option("--stale", is_flag=True,
              help="Read any OWNING copy (possibly stale) instead of the primary; answers "
                   "while the primary cannot (its lease lapsed, the control plane is down).")
@click.argument("key")
def get_cmd(seed: tuple[str, ...], secret_file: str | None, cache: str, stale: bool, key: str) -> None:
    """Print the value of KEY (exit status 1 when absent). Linearizable by default:
    the value of the last write acknowledged before the call, or a later one."""
    from .errors import NodeError
    cache, key = _text("--cache", cache), _text("KEY", key)
    try:
        with _client(seed, secret_file) as c:
            v = c.get(cache, key, consistency="stale" if stale else "linearizable")
    except NodeError as e:
        _fail(e)
    if v is None:
        click.echo("(absent)", err=True)
        sys.exit(1)
    click.echo(v.decode("utf-8", errors="backslashreplace"))


@cluster.command("remove")
@_seed
@_secret
@click.option("--cache", default="default", show_default=True)
@click.argument("key")
def remove_cmd(seed: tuple[str, ...], secret_file: str | None, cache: str, key: str) -> None:
    """Remove KEY; prints the update counter once acknowledged."""
    from .errors import NodeError
    cache, key = _text("--cache", cache), _text("KEY", key)
    try:
        with _client(seed, secret_file) as c:
            click.echo(f"ok counter={c.remove(cache, key)}")
    except NodeError as e:
        _fail(e)


@cluster.command("leave")
@_seed
@_secret
@click.argument("node_id")
def leave_cmd(seed: tuple[str, ...], secret_file: str | None, node_id: str) -> None:
    """Ask NODE_ID to leave gracefully: its partitions move away, then it exits."""
    from .errors import NodeError
    from .wire import Pool, load_secret
    node_id = _text("NODE_ID", node_id)
    try:
        Pool(load_secret(secret_file), role="client").call(seed[0], "leave", node=node_id)
    except NodeError as e:
        _fail(e)
    click.echo(f"{node_id} is leaving")


@cluster.group("settings")
def settings_grp() -> None:
    """Live, cluster-wide settings kept in the control plane (etcd); every node applies
    a change within a second, without a restart."""


_cp = click.option("--control-plane", "control_plane", required=True, multiple=True,
                   help="etcd client URL(s) (comma-separated or repeated).")
_prefix = click.option("--prefix", default="/ferry/default", show_default=True,
                       help="The cluster's key prefix in etcd ([control_plane] prefix).")


def _etcd(control_plane: tuple[str, ...]):  # type: ignore[no-untyped-def]
    from .control import Etcd
    return Etcd([u for x in control_plane for u in x.split(",") if u])


@settings_grp.command("get")
@_cp
@_prefix
@click.option("--json", "as_json", is_flag=True, help="One JSON object of every setting.")
@click.argument("key", required=False)
def settings_get(control_plane: tuple[str, ...], prefix: str, as_json: bool, key: str | None) -> None:
    """Print KEY's value (or every setting with its value; unset ones show the node default)."""
    from .errors import NodeError
    from .settings import current
    try:
        doc = current(_etcd(control_plane), prefix)
    except NodeError as e:
        _fail(e)
    if key is not None:
        if key not in doc:
            raise click.UsageError(f"unknown setting {key!r}; settings: {', '.join(sorted(doc))}")
        doc = {key: doc[key]}
    if as_json:
        click.echo(json.dumps({k: v["value"] for k, v in doc.items()}, indent=1))
        return
    for k, v in sorted(doc.items()):
        click.echo(f"{k} = {json.dumps(v['value'])}" + ("" if v["set"] else "   (default)"))


@settings_grp.command("set")
@_cp
@_prefix
@click.argument("key")
@click.argument("value")
def settings_set(control_plane: tuple[str, ...], prefix: str, key: str, value: str) -> None:
    """Set KEY to VALUE for the whole cluster (checked like the node's config file)."""
    from .errors import ConfigError, NodeError
    from .settings import put
    try:
        v = put(_etcd(control_plane), prefix, key, value)
    except ConfigError as e:
        raise click.UsageError(str(e))
    except NodeError as e:
        _fail(e)
    click.echo(f"{key} = {json.dumps(v)}")
