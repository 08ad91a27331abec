"""``ferry certs ...`` (a CA and certificates for etcd) and ``ferry etcd setup`` (etcd's
roles, users and auth for one cluster). Imports only click at module level."""
from __future__ import annotations

import json

import click


class InputError(click.ClickException):
    exit_code = 2


@click.group("certs")
def certs() -> None:
    """A CA and certificates: for etcd (the control plane: server certificates for its
    members, client certificates for nodes and operators) and for Ferry's own mutual
    TLS (node RPC, client RPC, file transfers: --node ID, --client NAME and
    --validator NAME)."""


@certs.command("init")
@click.argument("ca_dir", type=click.Path(file_okay=False))
@click.option("--name", default="ferry-etcd-ca", show_default=True, help="The CA's common name.")
@click.option("--days", type=click.IntRange(1, 36500), default=3650, show_default=True)
@click.option("--force", is_flag=True, help="Replace a CA already there (its certificates stop being trusted).")
def certs_init(ca_dir: str, name: str, days: int, force: bool) -> None:
    """Make a CA in CA_DIR: ca.crt (give it to etcd and every client) and ca.key (0600,
    keep it off the nodes)."""
    from .certs import init_ca
    from .errors import ConfigError
    try:
        out = init_ca(ca_dir, name=name, days=days, force=force)
    except ConfigError as e:
        raise InputError(str(e)) from None
    click.echo(f"CA certificate {out.cert}\nCA key         {out.key}")


@certs.command("issue")
@click.argument("ca_dir", type=click.Path(file_okay=False, exists=True))
@click.argument("name")
@click.option("--server", is_flag=True, help="A certificate for an etcd member (server and peer).")
@click.option("--node", "as_node", is_flag=True, help="A Ferry node's certificate for mutual TLS: NAME is "
              "the node id, named as the URI ferry://node/NAME (server and client use).")
@click.option("--client", "as_client", is_flag=True, help="A Ferry client's certificate for mutual TLS "
              "(ferry://client/NAME): the client methods only, never a node-only method or a transfer.")
@click.option("--validator", "as_validator", is_flag=True, help="A live validator's certificate for mutual "
              "TLS (ferry://validator/NAME, for ferry validate --cluster): the map, the validation fence "
              "and fetching partition files; no write and no other node-only method.")
@click.option("--ip", "ips", multiple=True, help="IP address the server is reached at (repeatable; "
              "default with --server and no --dns: 127.0.0.1 and ::1).")
@click.option("--dns", multiple=True, help="Host name the server is reached at (repeatable).")
@click.option("--cn", is_flag=True, help="Also put NAME in the common name (for etcdctl over gRPC; "
              "etcd's HTTP gateway, which the nodes use, refuses such a client certificate).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="Folder for NAME.crt and NAME.key "
              "(default: CA_DIR).")
@click.option("--days", type=click.IntRange(1, 36500), default=365, show_default=True)
def certs_issue(ca_dir: str, name: str, server: bool, as_node: bool, as_client: bool, as_validator: bool,
                ips: tuple[str, ...], dns: tuple[str, ...], cn: bool, out_dir: str | None, days: int) -> None:
    """Sign a certificate NAME with the CA in CA_DIR (an etcd client certificate unless
    --server, --node, --client or --validator)."""
    from .certs import issue
    from .errors import ConfigError
    if as_node + as_client + as_validator + server > 1:
        raise InputError("--server, --node, --client and --validator are exclusive: one certificate, one role")
    role = "node" if as_node else "client" if as_client else "validator" if as_validator else None
    try:
        out = issue(ca_dir, name, out_dir, server=server, ips=ips, dns=dns, days=days, cn=cn, role=role)
    except ConfigError as e:
        raise InputError(str(e)) from None
    click.echo(f"certificate {out.cert}\nkey         {out.key}")


@certs.command("show")
@click.argument("path", type=click.Path(dir_okay=False, exists=True))
@click.option("--json", "as_json", is_flag=True)
def certs_show(path: str, as_json: bool) -> None:
    """What the certificate PATH holds: subject, issuer, validity, names, usages."""
    from .certs import describe
    from .errors import ConfigError
    try:
        doc = describe(path)
    except ConfigError as e:
        raise InputError(str(e)) from None
    if as_json:
        click.echo(json.dumps(doc, indent=1))
        return
    for k, v in doc.items():
        click.echo(f"{k:11} {', '.join(v) if isinstance(v, list) else v}")


@certs.command("revoke")
@click.argument("ca_dir", type=click.Path(file_okay=False, exists=True))
@click.argument("cert", required=False, type=click.Path(dir_okay=False, exists=True))
@click.option("--serial", help="Revoke by serial number (hex, as ferry certs show prints it) instead of CERT.")
@click.option("--reason", type=click.Choice(["unspecified", "key_compromise", "affiliation_changed",
                                             "superseded", "cessation_of_operation", "privilege_withdrawn"]),
              default="unspecified", show_default=True)
@click.option("--days", type=click.IntRange(1, 36500), default=365, show_default=True,
              help="How long the new revocation list is valid (write a new one before then).")
@click.option("--json", "as_json", is_flag=True)
def certs_revoke(ca_dir: str, cert: str | None, serial: str | None, reason: str, days: int,
                 as_json: bool) -> None:
    """Revoke the certificate CERT (or --serial) of the CA in CA_DIR and write a new
    revocation list, CA_DIR/crl.pem, signed by the CA. Copy crl.pem to every node
    ([tls] crl) and client ($FERRY_TLS_CRL): within a second of the file changing, the
    certificate is refused at every handshake and its open connections are closed."""
    from .crl import revoke
    from .errors import ConfigError
    try:
        rec, new, path = revoke(ca_dir, cert, serial, reason, days)
    except ConfigError as e:
        raise InputError(str(e)) from None
    if as_json:
        click.echo(json.dumps({**rec.to_json(), "new": new, "crl": path}))
        return
    what = rec.identity or rec.subject or "certificate"
    click.echo(f"{'revoked' if new else 'already revoked'}: serial {rec.serial} ({what}), "
               f"{rec.reason}\nrevocation list {path}: copy it to every node and client")


@certs.command("crl")
@click.argument("ca_dir", type=click.Path(file_okay=False, exists=True))
@click.option("--days", type=click.IntRange(1, 36500), default=365, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def certs_crl(ca_dir: str, days: int, as_json: bool) -> None:
    """Write the CA's revocation list again (CA_DIR/crl.pem; empty when nothing is
    revoked): to start using one, or to renew it before its next update."""
    from .crl import revoked, write_crl
    from .errors import ConfigError
    try:
        path = write_crl(ca_dir, days)
        entries, number = revoked(ca_dir)
    except ConfigError as e:
        raise InputError(str(e)) from None
    if as_json:
        click.echo(json.dumps({"crl": path, "crl_number": number, "days": days,
                               "revoked": [r.to_json() for r in entries]}))
        return
    click.echo(f"revocation list {path}: {len(entries)} revoked, number {number}, valid {days} days")


@click.group("etcd")
def etcd() -> None:
    """etcd's access control for a Ferry cluster."""


@etcd.command("setup")
@click.option("--control-plane", "control_plane", required=True, multiple=True,
              help="etcd client URL(s), https:// (comma-separated or repeated).")
@click.option("--prefix", default="/ferry/default", show_default=True, help="The cluster's key prefix.")
@click.option("--ca", type=click.Path(dir_okay=False, exists=True), help="etcd's CA certificate.")
@click.option("--cert", type=click.Path(dir_okay=False, exists=True), help="A client certificate etcd trusts.")
@click.option("--key", type=click.Path(dir_okay=False, exists=True), help="Its private key.")
@click.option("--root-password-file", required=True, type=click.Path(dir_okay=False),
              help="The etcd root user's password; made (random) when the file does not exist.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Folder for the password files of the users made (0600).")
@click.option("--node-user", help="The nodes' etcd user (default ferry-NAME-node).")
@click.option("--reader-user", help="The read-only user (default ferry-NAME-reader).")
def etcd_setup(control_plane: tuple[str, ...], prefix: str, ca: str | None, cert: str | None,
               key: str | None, root_password_file: str, out_dir: str, node_user: str | None,
               reader_user: str | None) -> None:
    """With root access: a node role (read/write on PREFIX/) and a reader role (read on
    PREFIX/), a user for each, and etcd's authentication on. Safe to run again."""
    from .errors import ConfigError, NodeError
    from .etcdauth import setup
    endpoints = [u for x in control_plane for u in x.split(",") if u]
    try:
        s = setup(endpoints, prefix, out_dir, ca=ca, cert=cert, key=key,
                  root_password_file=root_password_file, node_user=node_user, reader_user=reader_user)
    except ConfigError as e:
        raise InputError(str(e)) from None
    except NodeError as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"made: {', '.join(s.created) or 'nothing (all in place)'}")
    click.echo(f"node user   {s.node_user} (role {s.node_role}: read/write {prefix}/), password in "
               f"{s.node_password_file}")
    click.echo(f"reader user {s.reader_user} (role {s.reader_role}: read {prefix}/), password in "
               f"{s.reader_password_file}")
    click.echo("a node's [control_plane]: endpoints, prefix, ca, cert, key (a client certificate from "
               f"ferry certs issue), user = \"{s.node_user}\", password_file = <its copy of the file>")
