"""A certificate authority for the control plane (etcd), made with ``cryptography``.

``ferry certs init DIR`` makes a CA (``ca.crt``, ``ca.key``); ``ferry certs issue DIR
NAME`` signs a certificate for NAME: ``--server`` for an etcd member (IP and DNS names
in its subject alternative names, loopback by default), otherwise a client certificate
named NAME in its subject's organizational unit. etcd with ``--client-cert-auth`` maps a
client certificate's common name to the etcd user of that name on its gRPC port, but its
HTTP gateway (what Ferry's nodes talk to) refuses any client certificate that has a
common name, so Ferry's client certificates have none (``--cn`` adds one, for etcdctl
over gRPC) and the nodes log in with an etcd user and password (node/etcdauth.py).
``ferry certs show FILE`` prints what a certificate holds.

The same CA signs the certificates of Ferry's own connections (mutual TLS for node RPC,
client RPC and file transfers, :mod:`transfer.tls`): ``--node ID`` makes a node's
certificate (a subject alternative name URI ``ferry://node/ID``, usable as server and
client), ``--client NAME`` a client's (``ferry://client/NAME``, client use only: the
client methods, never a node-only method or a transfer), ``--validator NAME`` a live
validator's (``ferry://validator/NAME``, client use only: the map, the validation
fence and fetching partition files; nothing else).

Keys are ECDSA P-256, written 0600; certificates are valid for ``days`` (a year by
default, the CA ten).
"""
from __future__ import annotations

import datetime
import ipaddress
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import ConfigError

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

CA_DAYS = 3650
CERT_DAYS = 365
LOOPBACK_IPS = ("127.0.0.1", "::1")
_IDENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")    # node/config.py's node id rule


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def write_file(path: str, data: bytes, mode: int) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _key_pem(key: "ec.EllipticCurvePrivateKey") -> bytes:
    from cryptography.hazmat.primitives import serialization
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _cert_pem(cert: "x509.Certificate") -> bytes:
    from cryptography.hazmat.primitives import serialization
    return cert.public_bytes(serialization.Encoding.PEM)


def read_cert(path: str) -> "x509.Certificate":
    from cryptography import x509
    try:
        with open(path, "rb") as f:
            return x509.load_pem_x509_certificate(f.read())
    except OSError as e:
        raise ConfigError(f"cannot read certificate {path}: {e.strerror}") from None
    except ValueError as e:
        raise ConfigError(f"{path} is not a PEM certificate ({str(e)[:80]})") from None


def read_key(path: str) -> "ec.EllipticCurvePrivateKey":
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    try:
        with open(path, "rb") as f:
            key = serialization.load_pem_private_key(f.read(), password=None)
    except OSError as e:
        raise ConfigError(f"cannot read key {path}: {e.strerror}") from None
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{path} is not an unencrypted PEM private key ({str(e)[:80]})") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ConfigError(f"{path}: expected an EC private key made by ferry certs init")
    return key


@dataclass(frozen=True)
class Issued:
    cert: str
    key: str


def ca_paths(ca_dir: str) -> Issued:
    return Issued(os.path.join(ca_dir, "ca.crt"), os.path.join(ca_dir, "ca.key"))


def init_ca(ca_dir: str, name: str = "ferry-etcd-ca", days: int = CA_DAYS, force: bool = False) -> Issued:
    """A new CA in ``ca_dir`` (refused when one is there, unless ``force``)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    out = ca_paths(ca_dir)
    if os.path.exists(out.key) and not force:
        raise ConfigError(f"{out.key} exists: a CA is already there (--force makes a new one, "
                          "and every certificate it signed stops being trusted)")
    os.makedirs(ca_dir, mode=0o700, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = utc_now()
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    write_file(out.key, _key_pem(key), 0o600)
    write_file(out.cert, _cert_pem(cert), 0o644)
    return out


def issue(ca_dir: str, name: str, out_dir: str | None = None, *, server: bool = False,
          ips: tuple[str, ...] = (), dns: tuple[str, ...] = (), days: int = CERT_DAYS,
          cn: bool = False, role: str | None = None) -> Issued:
    """Sign a certificate for ``name`` with the CA in ``ca_dir``; ``NAME.crt`` and
    ``NAME.key`` in ``out_dir`` (default ``ca_dir``). A server certificate (an etcd
    member) names ``ips`` and ``dns`` (loopback and localhost when both are empty) and
    may also be used as a client (etcd members dial each other with it). A client
    certificate names ``name`` in its organizational unit, and as its common name only
    with ``cn`` (etcd's gateway refuses a client certificate with a common name).
    ``role`` ``node``, ``client`` or ``validator`` adds the Ferry identity
    ``ferry://ROLE/NAME`` (a node certificate is also a server certificate; names
    follow the node config's id rule: letters, digits, ``_ . -``)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    if not name or "/" in name or name.startswith(".") or len(name) > 64:
        raise ConfigError(f"certificate name {name!r}: 1-64 characters, no '/', not starting with '.'")
    if role not in (None, "node", "client", "validator"):
        raise ConfigError(f"certificate role {role!r}: node, client or validator")
    if role is not None and not _IDENT.match(name):
        raise ConfigError(f"{role} name {name!r} must be 1-64 letters, digits, _ . - (as a node id)")
    server = server or role == "node"
    paths = ca_paths(ca_dir)
    ca_cert, ca_key = read_cert(paths.cert), read_key(paths.key)
    try:
        addrs = [ipaddress.ip_address(i) for i in ips]
    except ValueError as e:
        raise ConfigError(f"--ip: {e}") from None
    if server and role is None and not addrs and not dns:
        addrs = [ipaddress.ip_address(i) for i in LOOPBACK_IPS]
        dns = ("localhost",)
    key = ec.generate_private_key(ec.SECP256R1())
    now = utc_now()
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH] + ([ExtendedKeyUsageOID.SERVER_AUTH] if server else [])
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "ferry"),
             x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, name)]
    if server or cn:
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, name))
    b = (x509.CertificateBuilder()
         .subject_name(x509.Name(attrs))
         .issuer_name(ca_cert.subject).public_key(key.public_key())
         .serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(minutes=5))
         .not_valid_after(min(now + datetime.timedelta(days=days), ca_cert.not_valid_after_utc))
         .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
         .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, key_cert_sign=False,
                                      crl_sign=False, content_commitment=False, data_encipherment=False,
                                      key_agreement=True, encipher_only=False, decipher_only=False),
                        critical=True)
         .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
         .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                        critical=False))
    if addrs or dns or role:
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        sans += [x509.IPAddress(a) for a in addrs]
        if role:
            sans.append(x509.UniformResourceIdentifier(f"ferry://{role}/{name}"))
        b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = b.sign(ca_key, hashes.SHA256())
    out_dir = out_dir or ca_dir
    os.makedirs(out_dir, mode=0o700, exist_ok=True)
    out = Issued(os.path.join(out_dir, f"{name}.crt"), os.path.join(out_dir, f"{name}.key"))
    write_file(out.key, _key_pem(key), 0o600)
    write_file(out.cert, _cert_pem(cert), 0o644)
    return out


def describe(path: str) -> dict[str, object]:
    """What ``ferry certs show`` prints: subject CN, issuer, validity, names, usages."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID
    c = read_cert(path)

    def cn(n: x509.Name) -> str:
        a = n.get_attributes_for_oid(NameOID.COMMON_NAME)
        return str(a[0].value) if a else ""
    doc: dict[str, object] = {"file": path, "subject": c.subject.rfc4514_string(),
                              "subject_cn": cn(c.subject), "issuer": c.issuer.rfc4514_string(),
                              "issuer_cn": cn(c.issuer),
                              "serial": f"{c.serial_number:x}",
                              "not_before": c.not_valid_before_utc.isoformat(),
                              "not_after": c.not_valid_after_utc.isoformat(),
                              "expired": c.not_valid_after_utc < utc_now()}
    try:
        doc["ca"] = bool(c.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        doc["ca"] = False
    try:
        san = c.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        doc["ips"] = [str(i) for i in san.get_values_for_type(x509.IPAddress)]
        doc["dns"] = list(san.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        doc["ips"], doc["dns"] = [], []
        san = None
    uris = list(san.get_values_for_type(x509.UniformResourceIdentifier)) if san is not None else []
    doc["ferry_identity"] = next((u for u in uris if u.startswith("ferry://")), "")
    try:
        eku = c.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        doc["usages"] = sorted(u._name for u in eku)
    except x509.ExtensionNotFound:
        doc["usages"] = []
    return doc


__all__ = ["init_ca", "issue", "describe", "ca_paths", "Issued", "LOOPBACK_IPS", "read_cert", "read_key",
           "utc_now", "write_file"]
