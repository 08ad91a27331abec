"""Offline guessing against one recorded handshake: guesses per second an attacker gets
with the handshake's MAC under the secret itself (HMAC-SHA256 only) and under the
scrypt-derived key (transfer.auth), on this machine, one core.

    .venv/bin/python bench/handshake_guess_bench.py [--words 200000] [--kdf-guesses 30]

It records a real handshake over a socket pair (the CHALLENGE any stranger gets for one
HELLO is enough), then runs a dictionary against its server MAC: all of it with the
plain HMAC, ``--kdf-guesses`` guesses with the KDF (the rate is extrapolated). The
secret is placed last in the dictionary for the HMAC run, so the time is a full sweep.
"""
from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import random
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from transfer import auth  # noqa: E402
from transfer.frames import FrameType  # noqa: E402
from transfer.transport import SocketConn  # noqa: E402

SECRET = b"summer-password!"      # what an operator might pick; check_strength refuses it


def record(secret: bytes) -> tuple[bytes, bytes, str, bytes]:
    """(client nonce, server nonce, role, server MAC) of one real handshake."""
    a, b = socket.socketpair()
    client, server = SocketConn(a, "client"), SocketConn(b, "server")
    seen: dict[int, dict] = {}
    real = auth.read_frame

    def spy(conn, *args, **kw):  # type: ignore[no-untyped-def]
        fr = real(conn, *args, **kw)
        seen[fr.type] = dict(fr.body)
        return fr
    auth.read_frame = spy
    try:
        t = threading.Thread(target=auth.server_handshake, args=(server, secret))
        t.start()
        auth.client_handshake(client, secret, role="node")
        t.join()
    finally:
        auth.read_frame = real
        a.close()
        b.close()
    hello, ch = seen[FrameType.HELLO], seen[FrameType.CHALLENGE]
    return hello["nonce"], ch["nonce"], hello["role"], ch["mac"]


def words(n: int) -> list[bytes]:
    rnd = random.Random(1)
    letters = "abcdefghijklmnopqrstuvwxyz"
    return [("".join(rnd.choice(letters) for _ in range(rnd.randint(5, 9))) + "-password!").encode()
            for _ in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--words", type=int, default=200_000)
    ap.add_argument("--kdf-guesses", type=int, default=30)
    a = ap.parse_args()
    nc, ns, role, mac = record(SECRET)
    msg = b"ferry-server\0" + nc + ns + role.encode()
    dictionary = words(a.words - 1) + [SECRET]

    def hit_plain(guess: bytes) -> bool:     # the handshake without key derivation
        return hmac.compare_digest(hmac.new(guess, msg, hashlib.sha256).digest(), mac_plain)

    def hit_kdf(guess: bytes) -> bool:       # the handshake as it is
        return hmac.compare_digest(hmac.new(auth.derive_key(guess), msg, hashlib.sha256).digest(), mac)

    # the MAC a server without key derivation sends for the same nonces
    mac_plain = hmac.new(SECRET, msg, hashlib.sha256).digest()
    t0 = time.process_time()
    found = next((g for g in dictionary if hit_plain(g)), None)
    plain_s = time.process_time() - t0
    assert found == SECRET
    t0 = time.process_time()
    for g in dictionary[:a.kdf_guesses]:
        hit_kdf(g)
    kdf_s = time.process_time() - t0
    assert hit_kdf(SECRET) and not hit_plain(b"wrong")
    plain_rate = len(dictionary) / plain_s
    kdf_rate = a.kdf_guesses / kdf_s
    print(json.dumps({
        "kdf": auth.KDF_ID, "kdf_memory_mib": 128 * auth.KDF_N * auth.KDF_R * auth.KDF_P >> 20,
        "dictionary": len(dictionary),
        "hmac_only": {"cpu_s_full_sweep": round(plain_s, 3), "guesses_per_s": round(plain_rate)},
        "scrypt": {"cpu_ms_per_guess": round(1000 * kdf_s / a.kdf_guesses, 1),
                   "guesses_per_s": round(kdf_rate, 2),
                   "cpu_s_full_sweep_extrapolated": round(len(dictionary) / kdf_rate)},
        "cost_ratio": round(plain_rate / kdf_rate),
    }, indent=2))


if __name__ == "__main__":
    main()
