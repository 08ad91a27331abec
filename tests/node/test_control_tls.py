"""etcd served over https with a certificate this node does not trust: the node's etcd
client says so at once (a setup error), instead of "unreachable" for a minute."""
from __future__ import annotations

import datetime
import os
import shutil
import socket
import subprocess
import time

import pytest

from node.control import Etcd
from node.errors import ConfigError, ControlPlaneTLSError
from node.listen_ports import free_port

pytestmark = pytest.mark.skipif(shutil.which("etcd") is None, reason="etcd not installed")


def _cert(tmp) -> tuple[str, str]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    import ipaddress
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "private-ca-etcd")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    c, k = os.path.join(tmp, "etcd.crt"), os.path.join(tmp, "etcd.key")
    with open(c, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(k, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    return c, k



def test_an_untrusted_etcd_certificate_is_a_setup_error_said_at_once(tmp_path):
    crt, key = _cert(str(tmp_path))
    cport, pport = free_port(), free_port()
    url = f"https://127.0.0.1:{cport}"
    proc = subprocess.Popen(["etcd", "--data-dir", str(tmp_path / "d"), "--listen-client-urls", url,
                             "--advertise-client-urls", url, "--listen-peer-urls", f"http://127.0.0.1:{pport}",
                             "--initial-advertise-peer-urls", f"http://127.0.0.1:{pport}",
                             "--initial-cluster", f"default=http://127.0.0.1:{pport}",
                             "--cert-file", crt, "--key-file", key],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", cport)) == 0:
                    break
            time.sleep(0.1)
        t0 = time.monotonic()
        with pytest.raises(ControlPlaneTLSError, match="certificate verification failed") as e:
            Etcd([url]).get("/ferry/x")
        assert isinstance(e.value, ConfigError)          # a node stops at start, exit 2
        assert time.monotonic() - t0 < 10
    finally:
        proc.kill()
        proc.wait()
