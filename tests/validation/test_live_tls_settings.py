"""The live validator's certificate and settings without a cluster: ``ferry certs issue
--validator`` names ``ferry://validator/NAME`` (client use only), the RPC table gives
that role the map and the validation fence only, and the command line takes the three
TLS paths (all or none, not with the secret)."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from node import certs
from node.etcd_cli import certs as certs_cli
from node.errors import BadRequest
from node.rpcapi import CLIENT_METHODS, METHODS, VALIDATOR_METHODS, decode_request
from transfer.tls import TlsFiles, file_identity, identity_of
from validation.errors import ValidationError
from validation.job import live_settings
from validation.live import CertificateRefused, LiveSettings, read_map


def test_validator_certificate_names_its_role_and_is_client_only(tmp_path) -> None:
    ca = str(tmp_path / "pki")
    certs.init_ca(ca)
    r = CliRunner().invoke(certs_cli, ["issue", ca, "spark", "--validator", "--out", str(tmp_path / "v")])
    assert r.exit_code == 0, r.output
    crt = str(tmp_path / "v" / "spark.crt")
    doc = certs.describe(crt)
    assert doc["ferry_identity"] == "ferry://validator/spark"
    assert doc["usages"] == ["clientAuth"]
    assert str(file_identity(crt)) == "validator 'spark'"
    assert identity_of(["ferry://validator/a/b"]) is None
    r = CliRunner().invoke(certs_cli, ["issue", ca, "x", "--validator", "--node"])
    assert r.exit_code == 2 and "exclusive" in r.output


def test_the_validator_role_gets_the_map_and_the_fence_only() -> None:
    assert VALIDATOR_METHODS == {"ping", "get_map", "validate_fence", "validate_unfence"}
    assert "validate_fence" not in CLIENT_METHODS
    for name in METHODS:
        if name in VALIDATOR_METHODS:
            continue
        # refused before the arguments are looked at
        with pytest.raises(BadRequest, match=f"method '{name}' is"):
            decode_request(name, {"garbage": object()}, "validator")
    with pytest.raises(BadRequest, match="'handoff' is for nodes only"):
        decode_request("handoff", {}, "validator")
    with pytest.raises(BadRequest, match="'put' is not for a validator certificate"):
        decode_request("put", {}, "validator")
    with pytest.raises(BadRequest, match=r"'validate_fence' is for nodes only \(and live validators\)"):
        decode_request("validate_fence", {}, "client")


def test_command_line_tls_paths() -> None:
    s = live_settings("127.0.0.1:1", None, "/ferry/default", None, [], 4, None, ("ca", "c", "k"))
    assert s is not None and s.tls == TlsFiles("ca", "c", "k") and s.secret_file is None
    with pytest.raises(ValidationError, match="--tls-key not given"):
        live_settings("127.0.0.1:1", None, "/p", None, [], 4, None, ("ca", "c", None))
    with pytest.raises(ValidationError, match="not both"):
        live_settings("127.0.0.1:1", None, "/p", "secret", [], 4, None, ("ca", "c", "k"))
    with pytest.raises(ValidationError, match="for live mode"):
        live_settings(None, None, "/p", None, [], 4, None, ("ca", "c", "k"))


def test_client_certificate_or_missing_files_refused_before_any_connection(tmp_path) -> None:
    ca = str(tmp_path / "pki")
    certs.init_ca(ca)
    client = certs.issue(ca, "ops", str(tmp_path / "c"), role="client")
    files = TlsFiles(certs.ca_paths(ca).cert, client.cert, client.key)
    # 127.0.0.1:1 is never dialled: the certificate is refused first
    with pytest.raises(CertificateRefused, match="client 'ops'.*--validator"):
        read_map(LiveSettings(seeds=["127.0.0.1:1"], tls=files))
    with pytest.raises(CertificateRefused, match="is not a readable file"):
        read_map(LiveSettings(seeds=["127.0.0.1:1"], tls=TlsFiles(files.ca, str(tmp_path / "nope"), files.key)))
