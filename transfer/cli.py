"""``ferry transfer serve`` and ``ferry transfer fetch`` (group attribute ``transfer``),
and ``ferry secret generate`` (group attribute ``secret``).

The cluster secret comes from ``--secret-file`` or ``$FERRY_SECRET``, never from argv;
a weak one is refused (``transfer.auth.check_strength``).
``fetch --json`` prints one summary object on stdout (schema in docs/transfer.md);
progress bars go to stderr. Any failure exits non-zero with a one-line reason.
"""
from __future__ import annotations

import json
import logging
import sys
from typing import Any

import click

# Failures worth another attempt (the next attempt resumes from the verified chunks).
MAX_PARTITION = 2**31 - 1     # transfer.messages.MAX_PARTITION (not imported: --help stays light)


class _BadOption(click.ClickException):
    """An option value out of range: one line naming it and what to use, exit 2 (not a
    traceback from deep inside, as ``--port 70000`` gave)."""

    exit_code = 2

    def __init__(self, command: str, message: str) -> None:
        super().__init__(message)
        self.command = command

    def show(self, file: Any = None) -> None:
        click.echo(f"ferry transfer {self.command}: error: {self.message}", err=True)


def _between(lo: int, hi: int | None, hint: str) -> Any:
    """A click callback: every value of the option in lo..hi (hi None: no upper bound)."""
    def check(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        for v in value if isinstance(value, tuple) else (value,):
            if v is not None and not (lo <= v and (hi is None or v <= hi)):
                rng = f"{lo}..{hi}" if hi is not None else f"{lo} or more"
                raise _BadOption(ctx.info_name or "?", f"{param.opts[0]} {v} is out of range: "
                                 f"use {rng} ({hint})")
        return value
    return check


@click.group("transfer")
def transfer() -> None:
    """Serve and fetch partition files (part-<p>.bin)."""


@click.group("secret")
def secret() -> None:
    """Make cluster secrets."""


@secret.command("generate")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False, allow_dash=True),
              help="File to create with mode 0600 ('-': print to stdout).")
@click.option("--force", is_flag=True, help="Replace an existing file.")
def generate(out: str, force: bool) -> None:
    """Write a new random cluster secret (32 random bytes, 64 hex digits) to OUT.

    Give the same file to every node and tool of the cluster (--secret-file)."""
    import os

    from .auth import generate_secret

    value = generate_secret()
    if out == "-":
        click.echo(value.decode())
        return
    if not force and os.path.lexists(out):
        click.echo(f"ferry secret generate: error: {out} exists; pass --force to replace it", err=True)
        sys.exit(1)
    tmp = f"{out}.tmp-{os.getpid()}"
    try:
        # created 0600 from the start (never briefly readable), then renamed into place
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.fchmod(fd, 0o600)          # whatever the umask
            os.write(fd, value + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        if force:
            os.replace(tmp, out)
        else:
            os.link(tmp, out)             # fails if OUT appeared meanwhile
            os.unlink(tmp)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        click.echo(f"ferry secret generate: error: cannot write {out}: {e.strerror or e}", err=True)
        sys.exit(1)
    click.echo(f"wrote a new cluster secret to {out} (mode 0600)", err=True)


def _secret(path: str | None) -> bytes:
    from .auth import load_secret
    return load_secret(path)


def _tls_options(f: Any) -> Any:
    for opt in reversed([
            click.option("--tls-ca", type=click.Path(dir_okay=False), help="Mutual TLS: the cluster CA's "
                         "certificate (with --tls-cert and --tls-key; replaces the secret)."),
            click.option("--tls-cert", type=click.Path(dir_okay=False),
                         help="Mutual TLS: this side's node certificate (ferry certs issue --node)."),
            click.option("--tls-key", type=click.Path(dir_okay=False), help="Mutual TLS: its private key.")]):
        f = opt(f)
    return f


def _tls(ca: str | None, cert: str | None, key: str | None) -> Any:
    """TlsContexts from the three options, None when none is given."""
    if not (ca or cert or key):
        return None
    from .tls import TlsContexts, TlsError, TlsFiles
    if not (ca and cert and key):
        raise TlsError("TLS needs all of --tls-ca, --tls-cert and --tls-key")
    return TlsContexts(TlsFiles(ca, cert, key))


@transfer.command("serve")
@click.option("--dir", "directory", required=True, type=click.Path(file_okay=False, exists=True),
              help="Directory holding part-<p>.bin files (other caches in sub-directories).")
@click.option("--port", type=int, required=True, callback=_between(0, 65535, "0 picks a free port"),
              help="TCP port to listen on (0: any).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--secret-file", type=click.Path(dir_okay=False), help="Cluster secret file (or $FERRY_SECRET).")
@click.option("--rate", default=None, help="Node-wide send limit, e.g. 200MB (bytes/s).")
@click.option("--max-transfers", default=4, show_default=True,
              callback=_between(1, None, "concurrent transfers served"), help="Concurrent transfers served.")
@click.option("--limits-file", type=click.Path(dir_okay=False), default=None,
              help='JSON {"rate": "200MB", "max_transfers": 4}; overrides --rate/--max-transfers '
                   "and is re-read on SIGHUP while serving.")
@click.option("-v", "--verbose", is_flag=True, help="Log every transfer, not only failures.")
@_tls_options
def serve(directory: str, port: int, host: str, secret_file: str | None, rate: str | None,
          max_transfers: int, limits_file: str | None, verbose: bool, tls_ca: str | None,
          tls_cert: str | None, tls_key: str | None) -> None:
    """Serve the partition files of DIR to authenticated demanders."""
    import signal

    from .errors import TransferError
    from .limits import Limits, parse_rate, read_limits_file
    from .storage import DirectoryStorage
    from .supplier import SupplierServer

    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(message)s")
    try:
        limits = Limits(max_transfers, parse_rate(rate) if rate else None)
        if limits_file:
            file_rate, file_max = read_limits_file(limits_file)
            limits.set_rate(file_rate)
            limits.set_max_transfers(file_max)
        tls = _tls(tls_ca, tls_cert, tls_key)
        server = SupplierServer(DirectoryStorage(directory), b"" if tls else _secret(secret_file), host, port,
                                limits=limits, tls=tls)
    except (TransferError, ValueError, OSError) as e:
        _fail("serve", e)

    def reload(signum: int, frame: Any) -> None:
        # Runs in the main thread between accept() timeouts; running transfers take the
        # new rate at their next slice. A bad file keeps the limits in force.
        if not limits_file:
            logging.getLogger("ferry.transfer").warning("SIGHUP: no --limits-file to re-read")
            return
        try:
            new_rate, new_max = read_limits_file(limits_file)
        except ValueError as e:
            logging.getLogger("ferry.transfer").error("SIGHUP: %s; limits unchanged", e)
            return
        limits.set_rate(new_rate)
        limits.set_max_transfers(new_max)
        click.echo(f"limits now: rate={'unlimited' if new_rate is None else f'{new_rate:.0f} B/s'}, "
                   f"max_transfers={new_max}", err=True)
    signal.signal(signal.SIGHUP, reload)

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt
    # installed explicitly: a SIGINT ignored by the parent (inherited as SIG_IGN, as
    # under some test runners and nohup-like launchers) must still stop the server
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    h, p = server.address
    try:             # a stop signal may come as soon as the line below is out
        click.echo(f"serving {directory} on {h}:{p}", err=True)
        sys.stderr.flush()
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


@transfer.command("fetch")
@click.argument("peer")
@click.option("--partition", "partitions", type=int, multiple=True, required=True,
              callback=_between(0, MAX_PARTITION, "a partition number"),
              help="Partition to fetch (repeatable).")
@click.option("--dest", required=True, type=click.Path(file_okay=False), help="Directory to install into.")
@click.option("--cache", default="default", show_default=True)
@click.option("--secret-file", type=click.Path(dir_okay=False), help="Cluster secret file (or $FERRY_SECRET).")
@click.option("--ssh", "ssh_spec", default=None, help="Tunnel through SSH: USER@HOST[:PORT].")
@click.option("--ssh-key", default=None, type=click.Path(dir_okay=False), help="SSH private key file.")
@click.option("--known-hosts", default=None, type=click.Path(dir_okay=False),
              help="known_hosts file for the SSH host key check (default ~/.ssh/known_hosts).")
@click.option("--no-host-key-check", is_flag=True, help="Do not check the SSH host key (unsafe).")
@click.option("--rate", default=None, help="Receive limit, e.g. 200MB (bytes/s).")
@click.option("--retries", default=2, show_default=True,
              callback=_between(0, None, "0 tries once, N retries N times after a lost connection"),
              help="Resume attempts after a lost connection.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON summary on stdout.")
@_tls_options
@click.option("--tls-node", default=None, help="With TLS: the node id the supplier's certificate must name.")
def fetch(peer: str, partitions: tuple[int, ...], dest: str, cache: str, secret_file: str | None,
          ssh_spec: str | None, ssh_key: str | None, known_hosts: str | None, no_host_key_check: bool,
          rate: str | None, retries: int, as_json: bool, tls_ca: str | None, tls_cert: str | None,
          tls_key: str | None, tls_node: str | None) -> None:
    """Fetch partitions from the supplier at PEER (HOST:PORT) into DEST, verified."""
    import os

    from .demander import Demander
    from .errors import PeerClosed, TransferError
    from .limits import Limits, parse_rate
    from .storage import DirectoryStorage
    from .transport import parse_hostport

    logging.basicConfig(level=logging.ERROR, stream=sys.stderr, format="%(levelname)s %(message)s")
    results: list[dict[str, Any]] = []
    tunnel = None
    try:
        host, port = parse_hostport(peer)
        limits = Limits(1, parse_rate(rate) if rate else None)
        os.makedirs(dest, exist_ok=True)
        connect = None
        if ssh_spec:
            from .ssh import SSHTunnel
            tunnel = SSHTunnel.parse(ssh_spec, key_filename=ssh_key, known_hosts=known_hosts,
                                     check_host_key=not no_host_key_check)
            connect = tunnel.connector(host, port)
        tls = _tls(tls_ca, tls_cert, tls_key)
        if tls is not None and ssh_spec:
            raise ValueError("--ssh and --tls-* are exclusive: TLS runs over TCP to the supplier")
        demander = Demander(DirectoryStorage(dest), peer, b"" if tls else _secret(secret_file), limits=limits,
                            connect=connect, tls=tls, tls_peer=tls_node)
        with _Bars(len(partitions), quiet=False) as bars:
            for p in partitions:
                for attempt in range(retries + 1):
                    try:
                        res = demander.fetch(p, cache=cache, progress=bars.update)
                        break
                    except TransferError as e:
                        # a lost connection is resumed; any other failure is final
                        if not isinstance(e, PeerClosed) or attempt == retries:
                            raise
                        bars.note(p, f"connection lost ({e.reason}); resuming")
                results.append(res.summary())
                bars.done(p)
    except (TransferError, ValueError, OSError) as e:
        if as_json:
            click.echo(json.dumps({"partitions": results, "ok": False, "error": _one_line(e),
                                   "ktls_available": _ktls()}))
        _fail("fetch", e)
    finally:
        if tunnel is not None:
            tunnel.close()
    if as_json:
        # "path" per partition: sendfile, tls-userspace or ktls-sendfile (never chosen:
        # kernel TLS is only detected, "ktls_available" says whether this kernel has it)
        click.echo(json.dumps({"partitions": results, "ok": True, "ktls_available": _ktls()}))
    else:
        for r in results:
            click.echo(f"partition {r['partition']}: {r['bytes']} bytes, {r['bytes_wire']} over the wire, "
                       f"{r['bytes_reused']} reused, {r['mb_per_s']} MB/s, verified", err=True)


def _ktls() -> bool:
    from .tls import ktls_available
    return ktls_available()


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def _fail(cmd: str, e: BaseException) -> None:
    click.echo(f"ferry transfer {cmd}: error: {_one_line(e)}", err=True)
    sys.exit(1)


class _Bars:
    """A rich progress bar per partition plus a total (bytes, rate, ETA, stage) on stderr."""

    def __init__(self, count: int, quiet: bool) -> None:
        from rich.console import Console
        from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn,
                                   TimeRemainingColumn, TransferSpeedColumn)

        self.console = Console(stderr=True)
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                 TransferSpeedColumn(), TimeRemainingColumn(),
                                 TextColumn("{task.fields[stage]}"), console=self.console,
                                 disable=quiet or not self.console.is_terminal)
        self.tasks: dict[int, Any] = {}
        self.sizes: dict[int, int] = {}
        self.done_bytes: dict[int, int] = {}
        self.total = self.progress.add_task("total", total=None, stage=f"0/{count} partitions")
        self.count = count
        self.finished = 0

    def __enter__(self) -> "_Bars":
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def update(self, ev: Any) -> None:
        if ev.partition not in self.tasks:
            self.tasks[ev.partition] = self.progress.add_task(f"partition {ev.partition}", total=None,
                                                              stage=ev.stage)
        if ev.total:
            self.sizes[ev.partition] = ev.total
        self.done_bytes[ev.partition] = ev.done
        self.progress.update(self.tasks[ev.partition], completed=ev.done, total=ev.total or None,
                             stage=ev.stage)
        total = sum(self.sizes.values()) or None
        self.progress.update(self.total, completed=sum(self.done_bytes.values()), total=total,
                             stage=f"{self.finished}/{self.count} partitions")

    def note(self, partition: int, text: str) -> None:
        self.console.print(f"partition {partition}: {text}")

    def done(self, partition: int) -> None:
        self.finished += 1
        self.progress.update(self.total, stage=f"{self.finished}/{self.count} partitions")
