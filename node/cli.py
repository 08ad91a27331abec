"""``ferry node ...`` (run a node) and ``ferry cluster ...`` (status and data operations).

Imports only click at module level; the node machinery is imported inside commands.
"""
from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Callable, NoReturn

import click

if TYPE_CHECKING:
    from .client import Client
    from .control import Etcd
    from .reassign_ops import PlanDoc
    from .wire import Pool


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


def _fail(e: Exception) -> NoReturn:
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
    from .status import render, select, status_doc
    from .wire import client_pool
    try:
        pool = client_pool(secret_file)
        last: Exception | None = None
        for s in seed:
            try:
                doc = status_doc(pool, s)
                break
            except NodeError as e:
                last = e
        else:
            raise last if last is not None else NodeError("no --seed given")
    except NodeError as e:
        _fail(e)
    if one is not None:
        try:
            doc = select(doc, one)
        except KeyError:
            raise click.BadParameter(f"no partition {one!r} (CACHE/P, e.g. default/3)", param_hint="--partition")
    click.echo(json.dumps(doc, indent=1) if as_json else render(doc, all_partitions=all_partitions))


def _client(seed: tuple[str, ...], secret_file: str | None) -> "Client":
    from .client import Client
    from .wire import env_tls
    return Client(list(seed), secret_file=secret_file, tls=env_tls())


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
    from .rpcapi import Leave
    from .wire import client_pool
    node_id = _text("NODE_ID", node_id)
    try:
        client_pool(secret_file).request(seed[0], Leave(node_id))
    except NodeError as e:
        _fail(e)
    click.echo(f"{node_id} is leaving")


def _settings_help() -> str:
    """The help of ``ferry cluster settings``: every live key of node/config.py with its
    line of help, its values and its default."""
    from .config import BY_KEY, LIVE_KEYS
    keys = "\n".join(f"  {k}: {BY_KEY[k].help}; {BY_KEY[k].describe()}" for k in sorted(LIVE_KEYS))
    return ("Live, cluster-wide settings kept in the control plane (etcd); every node applies "
            "a change within a second, without a restart. A value is checked like the node's "
            "config file (docs/node.md, \"Configuration keys\").\n\n\b\nSettings:\n" + keys)


@cluster.group("settings", help=_settings_help())
def settings_grp() -> None:
    pass


_cp = click.option("--control-plane", "control_plane", required=True, multiple=True,
                   help="etcd client URL(s) (comma-separated or repeated).")
_prefix = click.option("--prefix", default="/ferry/default", show_default=True,
                       help="The cluster's key prefix in etcd ([control_plane] prefix).")


def _etcd(control_plane: tuple[str, ...]) -> "Etcd":
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


# -- reassignment plans (node/reassign.py: the controller's part; node/reassign_ops.py) --------
@cluster.group("reassign")
def reassign_grp() -> None:
    """Move partitions to owners you name: plans stored in etcd (P/reassign/<name>) that the
    controller applies, a bounded number of moves at a time, through the same moves,
    in-sync admission and hand-off as a join (docs/operations.md)."""


_secret_opt = click.option("--secret-file", type=click.Path(dir_okay=False),
                           help="Cluster secret (or $FERRY_SECRET): asks the moving nodes for bytes, "
                                "rate and ETA. Without it, stages come from etcd alone.")


def _plan_error(e: Exception, refused: bool = False) -> NoReturn:
    """A plan, name or flag that is wrong (``refused``: a plan refused whole, nothing
    stored): exit 2; anything else as _fail."""
    from .errors import PlanError
    if isinstance(e, PlanError):
        raise InputError(f"plan refused: {e}" if refused else str(e))
    _fail(e)


def _pool_or_none(secret_file: str | None) -> "Pool | None":
    """A client pool when a secret is at hand; none without one (a named but unusable
    secret file is an error)."""
    import os
    from .errors import NodeError
    from .wire import TLS_ENV, client_pool
    if not secret_file and not os.environ.get("FERRY_SECRET") and not any(os.environ.get(k) for k in TLS_ENV):
        return None
    try:
        return client_pool(secret_file)
    except NodeError as e:
        raise InputError(str(e)) from None


@reassign_grp.command("generate")
@_cp
@_prefix
@click.option("--add", "add", metavar="NODE", help="Give NODE (a live member) its rendezvous share.")
@click.option("--remove", "remove", metavar="NODE", help="Move every copy and primary role away from NODE.")
@click.option("--balance", is_flag=True, help="Every partition to its rendezvous owners (undoes pins).")
@click.option("--output", "-o", type=click.Path(dir_okay=False), help="Write the plan file here.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan file (JSON) instead of a summary.")
def reassign_generate(control_plane: tuple[str, ...], prefix: str, add: str | None, remove: str | None,
                      balance: bool, output: str | None, as_json: bool) -> None:
    """Compute a plan from the cluster now: moves of (cache, partition, from, to)."""
    from faults import fileio
    from .errors import NodeError
    from .reassign import generate, plan_file
    from .reassign_ops import read
    try:
        snap = read(_etcd(control_plane), prefix)
        moves = generate(snap.m, add=add, remove=remove, balance=balance)
    except NodeError as e:
        _plan_error(e)
    by = f"add {add}" if add else f"remove {remove}" if remove else "balance"
    doc = plan_file(moves, by, snap.revision)
    text = json.dumps(doc, indent=1) + "\n"
    if output and moves:
        fileio.atomic_write(output, text.encode())
    if as_json:
        click.echo(text, nl=False)
        return
    if not moves:
        click.echo(f"nothing to move ({by}): every partition already has those owners"
                   + (f"; {output} not written" if output else ""))
        return
    click.echo(f"{len(moves)} move(s) ({by}), from the cluster at revision {snap.revision}:")
    for mv in moves:
        click.echo(f"  {mv.cache}/{mv.partition}: {','.join(mv.source) or '-'} -> {','.join(mv.to)}")
    if output:
        click.echo(f"written to {output}; run: ferry cluster reassign execute {output} "
                   f"--control-plane {','.join(control_plane)}"
                   + (f" --prefix {prefix}" if prefix != "/ferry/default" else ""))
    else:
        click.echo("(preview: --output FILE writes the plan, --json prints it)")


def _report_wait(as_json: bool) -> "Callable[[PlanDoc], None]":
    """A progress printer for waits: a line whenever the counts change, else every 10 s."""
    import time
    from .reassign_ops import summary_line
    last_line, last_t = "", 0.0

    def report(doc: "PlanDoc") -> None:
        nonlocal last_line, last_t
        line = summary_line(doc)
        now = time.monotonic()
        if line.split(";")[0] != last_line.split(";")[0] or now - last_t >= 10:
            click.echo(line, err=as_json)
            last_line, last_t = line, now
    return report


@reassign_grp.command("execute")
@_cp
@_prefix
@_secret_opt
@click.argument("plan", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--name", help="Name of the plan in etcd (default: the file's name without .json).")
@click.option("--throttle", type=int, metavar="BYTES/S",
              help="Set transfer.rate_limit (per node, all file transfers) while the plan runs; "
                   "the controller puts the previous value back at its end.")
@click.option("--max-moves", type=int, default=0, show_default=True,
              help="At most this many of the plan's moves in flight (0: no bound of the plan's own).")
@click.option("--wait", "wait_end", is_flag=True, help="Wait until the plan ends, printing progress.")
@click.option("--timeout", type=float, default=0.0, help="With --wait: give up after this many seconds (0: never).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def reassign_execute(control_plane: tuple[str, ...], prefix: str, secret_file: str | None, plan: str,
                     name: str | None, throttle: int | None, max_moves: int, wait_end: bool,
                     timeout: float, as_json: bool) -> None:
    """Store PLAN (a file, or - for stdin) for the controller to apply. Refused whole if
    a node is dead or unknown, a cache unknown, a partition out of range, or the plan
    malformed."""
    import os
    import time
    from .errors import NodeError
    from .reassign import MAX_PLAN_BYTES, parse_plan, read_plan
    from .reassign_ops import execute, wait
    try:
        raw = sys.stdin.buffer.read(MAX_PLAN_BYTES + 1) if plan == "-" else read_plan(plan)
        moves = parse_plan(raw)
        if name is None:
            base = os.path.basename(plan)
            name = base[:-5] if base.endswith(".json") else base
            if plan == "-":
                name = f"plan-{int(time.time())}"
        etcd = _etcd(control_plane)
        rev = execute(etcd, prefix, name, moves, max_moves=max_moves, throttle=throttle)
    except NodeError as e:
        _plan_error(e, refused=True)
    out: dict[str, object] = {"plan": name, "moves": len(moves), "revision": rev, "max_moves": max_moves,
                              "throttle": throttle}
    if not as_json:
        click.echo(f"plan {name} stored ({len(moves)} move(s), revision {rev}); the controller applies it. "
                   f"Follow it: ferry cluster reassign status {name}")
    if wait_end:
        try:
            doc = wait(etcd, prefix, name, pool=_pool_or_none(secret_file), timeout=timeout,
                       report=_report_wait(as_json))
        except NodeError as e:
            _fail(e)
        out["status"] = doc
    if as_json:
        click.echo(json.dumps(out, indent=1))
    st = out.get("status")
    if wait_end and not (isinstance(st, dict) and st.get("state") == "done"):
        sys.exit(1)


@reassign_grp.command("status")
@_cp
@_prefix
@_secret_opt
@click.argument("plan", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (docs/operations.md).")
@click.option("--sample", type=float, default=1.0, show_default=True,
              help="Seconds between the two looks at the moving nodes (rate, last progress); 0: one look.")
def reassign_status(control_plane: tuple[str, ...], prefix: str, secret_file: str | None, plan: str | None,
                    as_json: bool, sample: float) -> None:
    """Per move of PLAN (or of every stored plan): stage (waiting, moving, in sync, done,
    cancelled), bytes, rate, ETA, last progress and what it waits for."""
    from .errors import NodeError
    from .reassign_ops import read, render, status
    pool = _pool_or_none(secret_file)
    try:
        doc = status(read(_etcd(control_plane), prefix), plan, pool, sample=sample)
    except NodeError as e:
        _plan_error(e)
    if as_json:
        click.echo(json.dumps(doc, indent=1))
        return
    if not doc["plans"]:
        click.echo("no plans stored")
        return
    click.echo(render(doc, with_figures=pool is not None))


@reassign_grp.command("cancel")
@_cp
@_prefix
@click.argument("plan")
@click.option("--wait-s", type=float, default=30.0, show_default=True,
              help="How long to wait for the controller to apply the cancel.")
@click.option("--json", "as_json", is_flag=True)
def reassign_cancel(control_plane: tuple[str, ...], prefix: str, plan: str, wait_s: float, as_json: bool) -> None:
    """Stop PLAN: its moves not done stop and the owners they would have replaced stay
    (each partition gets back the pin it had before); done moves stay done."""
    from .errors import NodeError
    from .reassign import CANCELLED, DONE
    from .reassign_ops import cancel, state_of
    try:
        pl = cancel(_etcd(control_plane), prefix, plan, wait_s)
    except NodeError as e:
        _plan_error(e)
    stopped = sum(1 for i, pr in pl.progress.items() if pr.stage == CANCELLED)
    done = sum(1 for pr in pl.progress.values() if pr.stage == DONE)
    unstarted = len(pl.moves) - len(pl.progress)
    doc = {"plan": plan, "state": state_of(pl), "stopped": stopped, "done": done, "never_started": unstarted}
    if as_json:
        click.echo(json.dumps(doc, indent=1))
    elif pl.end is None:
        click.echo(f"cancel of {plan} requested; no controller applied it within {wait_s:.0f}s "
                   "(is one elected?); it applies when one does", err=True)
    else:
        click.echo(f"plan {plan} {state_of(pl)}: {stopped} move(s) stopped (their old owners stay), "
                   f"{done} done, {unstarted} never started")
    if pl.end is None:
        sys.exit(1)


@reassign_grp.command("verify")
@_cp
@_prefix
@click.argument("plan")
@click.option("--json", "as_json", is_flag=True)
def reassign_verify(control_plane: tuple[str, ...], prefix: str, plan: str, as_json: bool) -> None:
    """Exit 0 when every partition of PLAN is held by its target owners, OWNING and in
    sync, the first one primary, and by nobody else; else 1, naming what is not."""
    from .errors import NodeError
    from .reassign_ops import read, verify
    try:
        doc = verify(read(_etcd(control_plane), prefix), plan)
    except NodeError as e:
        _plan_error(e)
    if as_json:
        click.echo(json.dumps(doc, indent=1))
    else:
        bad = [mv for mv in doc["moves"] if not mv["ok"]]
        for mv in bad:
            click.echo(f"  {mv['cache']}/{mv['partition']} -> {','.join(mv['to'])}: {mv['problem']}")
        click.echo(f"plan {plan}: " + ("every partition held by its target owners, in sync" if not bad
                                       else f"{len(bad)} of {len(doc['moves'])} partition(s) not as planned"))
    if not doc["ok"]:
        sys.exit(1)


@cluster.command("drain")
@_cp
@_prefix
@_secret_opt
@click.argument("node_id")
@click.option("--throttle", type=int, metavar="BYTES/S", help="transfer.rate_limit while the drain runs.")
@click.option("--max-moves", type=int, default=0, show_default=True, help="At most this many moves in flight.")
@click.option("--timeout", type=float, default=0.0, help="Give up waiting after this many seconds (0: never).")
@click.option("--json", "as_json", is_flag=True, help="Print the final report as JSON (progress on stderr).")
def drain_cmd(control_plane: tuple[str, ...], prefix: str, secret_file: str | None, node_id: str,
              throttle: int | None, max_moves: int, timeout: float, as_json: bool) -> None:
    """Move every copy and primary role away from NODE_ID (a plan `drain-NODE_ID`,
    generated and executed), wait with progress, report. The node keeps running,
    holding nothing; stop it, or bring partitions back with `reassign generate --add`."""
    import time
    from .errors import NodeError
    from .reassign_ops import drain, holdings, read, wait
    node_id = _text("NODE_ID", node_id)
    etcd = _etcd(control_plane)
    t0 = time.monotonic()
    try:
        name, moves = drain(etcd, prefix, node_id, max_moves=max_moves, throttle=throttle)
    except NodeError as e:
        _plan_error(e, refused=True)
    doc: dict[str, object] = {"node": node_id, "plan": name if moves else None, "moves": len(moves)}
    if moves:
        click.echo(f"draining {node_id}: plan {name}, {len(moves)} move(s)", err=as_json)
        try:
            last = wait(etcd, prefix, name, pool=_pool_or_none(secret_file), timeout=timeout,
                        report=_report_wait(as_json))
        except NodeError as e:
            _fail(e)
        doc["state"] = last["state"]
        doc["status"] = last
    try:
        left = holdings(read(etcd, prefix).m, node_id)
    except NodeError as e:
        _fail(e)
    doc.update(seconds=round(time.monotonic() - t0, 1), still_holds=left, ok=not left)
    if as_json:
        click.echo(json.dumps(doc, indent=1))
    elif left:
        click.echo(f"{node_id} still holds {len(left)} partition(s): {', '.join(left[:20])}"
                   + (" ..." if len(left) > 20 else "") + f" (ferry cluster reassign status {name})")
    else:
        click.echo(f"{node_id} holds nothing: {len(moves)} move(s) done in {doc['seconds']}s; "
                   "it can be stopped")
    if left:
        sys.exit(1)
