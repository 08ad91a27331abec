"""The start's warm-up thread (node/node.py ``_warm_up``): the handshake key derived
while recovery runs is the one the RPC server and the supplier then use, and a failure
there is left for the real use to report."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from node import node as node_mod
from transfer import auth

DERIVE = auth.derive_key          # the real derivation, before any test replaces it


def _counting(monkeypatch: pytest.MonkeyPatch, fail: bool = False) -> list[bytes]:
    calls: list[bytes] = []

    def derive(secret: bytes) -> bytes:
        calls.append(secret)
        if fail:
            raise ValueError("scrypt is not available")
        return DERIVE(secret)

    monkeypatch.setattr(auth, "derive_key", derive)
    return calls


def test_the_key_derived_in_the_warm_up_is_the_one_used_later(monkeypatch):
    calls = _counting(monkeypatch)
    secret = os.urandom(32)
    node_mod._warm_up(secret)
    assert calls == [secret]
    assert "etcd3gw" in sys.modules and "node.placement" in sys.modules
    key = auth.handshake_key(secret)          # what RpcServer and the supplier call
    assert calls == [secret]                  # not derived a second time
    assert key == DERIVE(secret)


def test_a_client_imports_no_numpy():
    # node.client reads maps and routes: the placement table (numpy) is the nodes'
    code = "import sys, node.client, node.cluster_map; print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_no_secret_no_derivation(monkeypatch):
    calls = _counting(monkeypatch)
    node_mod._warm_up(b"")                    # mutual TLS: the certificates authenticate
    assert calls == []


def test_a_failure_in_the_warm_up_is_raised_by_the_real_use(monkeypatch):
    calls = _counting(monkeypatch, fail=True)
    secret = os.urandom(32)
    node_mod._warm_up(secret)                 # does not raise
    with pytest.raises(ValueError, match="scrypt is not available"):
        auth.handshake_key(secret)
    assert calls == [secret, secret]
