"""Certificate revocation for the cluster CA (``ferry certs revoke`` / ``ferry certs crl``).

A certificate whose key leaked, or that belongs to a node, client or validator that
must lose its access before the certificate expires, is **revoked**: its serial number
goes into ``CA_DIR/revoked.json`` (the CA's record: serial, Ferry identity, subject,
when and why), and the CA signs a new certificate revocation list, ``CA_DIR/crl.pem``
(X.509 v2 CRL, RFC 5280: every revoked serial with its date and reason, a CRL number
one higher than the last, valid for ``days``). Copy ``crl.pem`` to every node and every
client or validator host; a node's ``[tls] crl`` (a client's ``$FERRY_TLS_CRL``) names
it. transfer.tls checks the list when it loads (signed by the CA, not expired, not
listing the holder's own certificate), refuses every handshake from a listed
certificate, and closes connections already open from one within ``check_every``
seconds of the file changing. A list past its next update is refused, so write a new
one (``ferry certs crl CA_DIR``) before it runs out: 365 days by default.

Revocation is by serial number, so a revoked identity can come back only with a new
certificate (``ferry certs issue`` makes a new serial every time).
"""
from __future__ import annotations

import datetime
import json
import os
from dataclasses import dataclass

from transfer.tls import file_identity, serial_hex

from .certs import ca_paths, read_cert, read_key, utc_now, write_file
from .errors import ConfigError

CRL_FILE = "crl.pem"
REVOKED_FILE = "revoked.json"
CRL_DAYS = 365
REASONS = ("unspecified", "key_compromise", "affiliation_changed", "superseded",
           "cessation_of_operation", "privilege_withdrawn")


@dataclass(frozen=True)
class Revoked:
    serial: str           # upper-case hex, as transfer.tls and ssl's getpeercert() write it
    identity: str         # the certificate's ferry:// URI ("" when it names none)
    subject: str
    revoked_at: str       # ISO 8601, UTC
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"serial": self.serial, "identity": self.identity, "subject": self.subject,
                "revoked_at": self.revoked_at, "reason": self.reason}


def crl_path(ca_dir: str) -> str:
    return os.path.join(ca_dir, CRL_FILE)


def revoked(ca_dir: str) -> tuple[list[Revoked], int]:
    """The CA's revoked certificates and the last CRL number written (0: none yet)."""
    path = os.path.join(ca_dir, REVOKED_FILE)
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read(16 << 20))
    except FileNotFoundError:
        return [], 0
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} does not read as the CA's revocation record ({str(e)[:80]}); "
                          "restore it from a backup: it is the only list of revoked serials") from None
    try:
        out = [Revoked(str(r["serial"]).upper(), str(r.get("identity", "")), str(r.get("subject", "")),
                       str(r["revoked_at"]), str(r.get("reason", "unspecified")))
               for r in doc["revoked"]]
        number = int(doc.get("crl_number", 0))
        for r in out:
            int(r.serial, 16)
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"{path} is not a revocation record ({type(e).__name__}: {e})") from None
    return out, number


def _save(ca_dir: str, entries: list[Revoked], number: int) -> None:
    body = {"crl_number": number, "revoked": [r.to_json() for r in entries]}
    write_file(os.path.join(ca_dir, REVOKED_FILE), (json.dumps(body, indent=1) + "\n").encode(), 0o644)


def write_crl(ca_dir: str, days: int = CRL_DAYS) -> str:
    """Sign and write ``CA_DIR/crl.pem`` from the CA's record (an empty list when
    nothing is revoked); returns its path. The CRL number goes up by one each time."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    if days < 1:
        raise ConfigError(f"--days {days}: a revocation list must be valid for at least a day")
    ca = ca_paths(ca_dir)
    ca_cert, ca_key = read_cert(ca.cert), read_key(ca.key)
    entries, number = revoked(ca_dir)
    now = utc_now()
    b = (x509.CertificateRevocationListBuilder().issuer_name(ca_cert.subject)
         .last_update(now).next_update(now + datetime.timedelta(days=days))
         .add_extension(x509.CRLNumber(number + 1), critical=False))
    for r in entries:
        rb = (x509.RevokedCertificateBuilder().serial_number(int(r.serial, 16))
              .revocation_date(datetime.datetime.fromisoformat(r.revoked_at)))
        if r.reason != "unspecified":
            rb = rb.add_extension(x509.CRLReason(getattr(x509.ReasonFlags, r.reason)), critical=False)
        b = b.add_revoked_certificate(rb.build())
    crl = b.sign(ca_key, hashes.SHA256())
    from cryptography.hazmat.primitives import serialization
    path = crl_path(ca_dir)
    _save(ca_dir, entries, number + 1)
    write_file(path, crl.public_bytes(serialization.Encoding.PEM), 0o644)
    return path


def revoke(ca_dir: str, cert_path: str | None = None, serial: str | None = None,
           reason: str = "unspecified", days: int = CRL_DAYS) -> tuple[Revoked, bool, str]:
    """Revoke a certificate of this CA, by its file or its serial (hex): (the record,
    whether it is new, the CRL written). Revoking a serial again changes nothing but
    writes the list again."""
    if reason not in REASONS:
        raise ConfigError(f"reason {reason!r}: one of {', '.join(REASONS)}")
    if (cert_path is None) == (serial is None):
        raise ConfigError("give the certificate file or its serial (one of the two)")
    ca_cert = read_cert(ca_paths(ca_dir).cert)
    identity = subject = ""
    if cert_path is not None:
        c = read_cert(cert_path)
        if c.issuer != ca_cert.subject:
            raise ConfigError(f"{cert_path} is issued by {c.issuer.rfc4514_string()}, not by this CA "
                              f"({ca_cert.subject.rfc4514_string()}): its own CA must revoke it")
        if c.serial_number == ca_cert.serial_number:
            raise ConfigError(f"{cert_path} is the CA's own certificate: to retire a CA, make a new one "
                              "(ferry certs init) and issue every certificate again")
        who = file_identity(cert_path)      # the certificate's ferry:// URI, if it names one
        identity = f"ferry://{who.role}/{who.name}" if who is not None else ""
        sid, subject = serial_hex(c.serial_number), c.subject.rfc4514_string()
    else:
        assert serial is not None
        try:
            sid = serial_hex(int(serial.replace(":", ""), 16))
        except ValueError:
            raise ConfigError(f"serial {serial!r} is not hexadecimal (ferry certs show prints it)") from None
    entries, number = revoked(ca_dir)
    known = next((r for r in entries if r.serial == sid), None)
    new = known is None
    if known is None:
        known = Revoked(sid, identity, subject, utc_now().isoformat(), reason)
        entries.append(known)
        _save(ca_dir, entries, number)
    return known, new, write_crl(ca_dir, days)


__all__ = ["CRL_DAYS", "CRL_FILE", "REASONS", "REVOKED_FILE", "Revoked", "crl_path", "revoke",
           "revoked", "write_crl"]
