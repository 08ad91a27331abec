"""Mutual challenge-response authentication with a key derived from the cluster secret.

Reusable by every Ferry connection (node-to-node, client-to-node): call
:func:`client_handshake` on the connecting side and :func:`server_handshake` on the
accepting side, right after connecting and before anything else is read or written.

::

    K = scrypt(secret, salt="ferry-handshake-key\\0v1", n=2**15, r=8, p=1, 32 bytes)
    client -> HELLO     {"nonce": Nc, "role": r, "kdf": KDF_ID}
    server -> CHALLENGE {"nonce": Ns, "kdf": KDF_ID, "mac": HMAC(K, "ferry-server\\0" | Nc | Ns | r)}
    client    checks the server's mac (a server without K is refused here)
    client -> RESPONSE  {"mac": HMAC(K, "ferry-client\\0" | Ns | Nc | r)}
    server    checks the client's mac
    server -> AUTH_OK   {}

Both nonces are 32 fresh random bytes, so a recorded handshake replayed against either
side fails: the replayed mac covers the other side's old nonce. The two labels keep a
server's answer from being reflected back to it as a client response.

A recorded exchange (or the CHALLENGE any stranger gets for one HELLO) still lets an
attacker test guesses of the secret offline; K is therefore derived with scrypt
(32 MiB and about 70 ms of CPU per guess), so each guess costs that instead of one
HMAC. A process derives K once per secret (:func:`handshake_key` caches it), not per
connection. :func:`check_strength` refuses secrets that a dictionary or a pattern
would find anyway, and :func:`generate_secret` makes a good one (``ferry secret
generate``). The secret never crosses the wire and never appears on a command line:
:func:`load_secret` reads it from a file or an environment variable.
"""
from __future__ import annotations

import hashlib
import hmac
import math
import os
import re
import secrets
import stat
import threading
from typing import Any, Callable

from . import safefs
from .errors import AuthError, FrameError, PeerClosed, RemoteError, UnsafePath
from .frames import ErrorCode, FrameType, Sealer, read_frame, send_error, write_frame
from .transport import Conn

NONCE_SIZE = 32
SECRET_ENV = "FERRY_SECRET"
MAX_SECRET_FILE = 64 << 10   # a secret is a line; anything this big is the wrong file
# Frames a server reads before the peer has proved the secret are tiny (HELLO is about
# 100 bytes, RESPONSE about 50): strangers must not make it buffer a full 1 MiB frame.
HANDSHAKE_MAX_PAYLOAD = 4096
HANDSHAKE_DEADLINE = 10.0    # seconds for the whole handshake, however the bytes trickle in
_SERVER_LABEL = b"ferry-server\0"
_CLIENT_LABEL = b"ferry-client\0"
_SESSION_LABEL = b"ferry-session\0"   # the session key: every later frame's MAC (frames.Sealer)

# The handshake key: scrypt of the secret. n=2**15, r=8 takes 128*n*r = 32 MiB and about
# 70 ms of CPU per derivation, which is what every offline guess costs an attacker who
# recorded one exchange. The salt is fixed (both sides must derive the same key without
# talking first), so equal secrets give equal keys in every cluster: secrets must also
# be random (check_strength), not only slow to test.
KDF_N, KDF_R, KDF_P = 2 ** 15, 8, 1
KDF_SALT = b"ferry-handshake-key\0v1"
KDF_ID = f"scrypt:n={KDF_N},r={KDF_R},p={KDF_P}"
_KDF_MAXMEM = 2 * 128 * KDF_N * KDF_R * KDF_P      # OpenSSL's default cap is 32 MiB exactly

# What a secret must have (check_strength; docs/threat-model.md).
MIN_SECRET = 16          # bytes
MIN_DISTINCT = 8         # distinct byte values (10 would refuse 1 in 10,000 secrets of 32 random hex digits)
MIN_BITS = 64            # estimated, see estimate_bits
WORD_LETTER_BITS = 2.0   # a letter inside a dictionary-like word
REPEATED_SYMBOL_BITS = 1.0   # a punctuation byte used before (word separators)
_VOWELS = frozenset(b"aeiouyAEIOUY")
_KEYS = {ord(c): (row, col) for row, keys in enumerate(("1234567890", "qwertyuiop", "asdfghjkl", "zxcvbnm"))
         for col, c in enumerate(keys)}
_KEYS.update({ord(chr(k).upper()): v for k, v in list(_KEYS.items()) if chr(k).isalpha()})
_CONSONANTS4 = re.compile(r"[^aeiouy]{4}", re.IGNORECASE)   # rare in words, common in noise


def derive_key(secret: bytes) -> bytes:
    """The handshake key of ``secret`` (slow on purpose: use :func:`handshake_key`)."""
    return hashlib.scrypt(secret, salt=KDF_SALT, n=KDF_N, r=KDF_R, p=KDF_P,
                          maxmem=_KDF_MAXMEM, dklen=32)


_keys: dict[bytes, bytes] = {}
_keys_lock = threading.Lock()


def handshake_key(secret: bytes) -> bytes:
    """``derive_key(secret)``, derived once per process and secret. Concurrent first
    callers wait for the one derivation instead of each running their own."""
    key = _keys.get(secret)
    if key is None:
        with _keys_lock:
            key = _keys.get(secret)
            if key is None:
                key = derive_key(secret)
                if len(_keys) >= 32:      # a process holds one secret, tests a few
                    _keys.clear()
                _keys[secret] = key
    return key


def _alphabet(secret: bytes) -> int:
    """Size of the union of the character classes ``secret`` uses."""
    size = 0
    if any(0x30 <= b <= 0x39 for b in secret):
        size += 10
    if any(0x61 <= b <= 0x7A for b in secret):
        size += 26
    if any(0x41 <= b <= 0x5A for b in secret):
        size += 26
    if any(0x20 <= b <= 0x7E and not chr(b).isalnum() for b in secret):
        size += 33
    if any(b < 0x20 or b > 0x7E for b in secret):
        size = 256
    return max(size, 2)


def _word_letters(secret: bytes) -> set[int]:
    """Positions of letters inside dictionary-like words: runs of 3+ ASCII letters, cut
    where a lowercase letter is followed by a capital, that are all lowercase, all
    capitals or Capitalized, hold a vowel and no four consonants in a row (``summer``,
    ``Password``, ``CLUSTER``; not ``pQrTzLm`` nor ``xkqvbt``)."""
    out: set[int] = set()
    i, n = 0, len(secret)
    while i < n:
        if not chr(secret[i]).isascii() or not chr(secret[i]).isalpha():
            i += 1
            continue
        j = i + 1
        while j < n and chr(secret[j]).isascii() and chr(secret[j]).isalpha() and not (
                chr(secret[j - 1]).islower() and chr(secret[j]).isupper()):
            j += 1
        word = secret[i:j].decode()
        if (len(word) >= 3 and (word.islower() or word.isupper() or word.istitle())
                and any(b in _VOWELS for b in secret[i:j]) and not _CONSONANTS4.search(word)):
            out.update(range(i, j))
        i = j
    return out


def _step(a: int, b: int, c: int, where: Callable[[int], tuple[int, int] | None]) -> bool:
    """c continues a one-step walk a -> b -> c (in code points, or along a row of a
    keyboard when ``where`` places the keys)."""
    pa, pb, pc = where(a), where(b), where(c)
    if pa is None or pb is None or pc is None or not pa[0] == pb[0] == pc[0]:
        return False
    return abs(pb[1] - pa[1]) == 1 and pc[1] - pb[1] == pb[1] - pa[1]


def estimate_bits(secret: bytes) -> float:
    """A deliberately simple strength estimate. Each byte adds:

    - 0 bits if a pattern predicts it: it repeats the byte before (``aaaa``), continues
      a step of +1 or -1 (``1234``, ``dcba``) or along a keyboard row (``qwerty``,
      ``lkjh``), or ends a 3-byte sequence seen earlier
      in the secret (``secretsecret``);
    - WORD_LETTER_BITS if it is a letter of a dictionary-like word (_word_letters);
    - REPEATED_SYMBOL_BITS if it is punctuation already used earlier (the ``-`` that
      joins words);
    - otherwise log2 of the alphabet the secret draws from (digits 10, lowercase 26,
      capitals 26, other printable ASCII 33, summed over the classes used; any other
      byte: 256).
    """
    per_byte = math.log2(_alphabet(secret))
    words = _word_letters(secret)
    seen: set[bytes] = set()
    bits = 0.0
    for i, b in enumerate(secret):
        tri = secret[i - 2:i + 1] if i >= 2 else b""
        predicted = (i >= 1 and b == secret[i - 1]) or (i >= 2 and (
            _step(secret[i - 2], secret[i - 1], b, lambda x: (0, x))
            or _step(secret[i - 2], secret[i - 1], b, _KEYS.get))) or tri in seen
        if tri:
            seen.add(tri)
        if predicted:
            continue
        if i in words:
            bits += WORD_LETTER_BITS
        elif 0x20 <= b <= 0x7E and not chr(b).isalnum() and b in secret[:i]:
            bits += REPEATED_SYMBOL_BITS
        else:
            bits += per_byte
    return bits


def check_strength(secret: bytes) -> None:
    """Refuse (AuthError) a secret an attacker could guess: shorter than MIN_SECRET
    bytes, fewer than MIN_DISTINCT distinct bytes, or below MIN_BITS by
    :func:`estimate_bits`. Random secrets (``ferry secret generate``: 32 random bytes
    as 64 hex digits) pass with a wide margin."""
    fix = "make one with `ferry secret generate --out FILE`"
    if len(secret) < MIN_SECRET:
        raise AuthError(f"cluster secret is {len(secret)} bytes; use at least {MIN_SECRET} "
                        f"random bytes: {fix}")
    distinct = len(set(secret))
    if distinct < MIN_DISTINCT:
        raise AuthError(f"cluster secret is too weak: only {distinct} distinct characters "
                        f"(at least {MIN_DISTINCT}); {fix}")
    bits = estimate_bits(secret)
    if bits < MIN_BITS:
        raise AuthError(f"cluster secret is too weak: about {bits:.0f} bits (repeated or "
                        f"sequential characters, dictionary words), at least {MIN_BITS} "
                        f"needed; {fix}")


def generate_secret() -> bytes:
    """A new cluster secret: 32 random bytes as 64 lowercase hex digits (256 bits)."""
    while True:
        s = secrets.token_hex(32).encode()
        try:
            check_strength(s)          # never fails in practice; checked all the same
            return s
        except AuthError:
            continue


def load_secret(path: str | None = None, *, env: str = SECRET_ENV) -> bytes:
    """The cluster secret from ``path`` (whitespace stripped) or else ``$env``.

    The file must be a regular file (a symlink to one is fine: mounted secrets are
    links); a FIFO or device is refused at once instead of blocking the process, and
    its mode is checked on the file actually read. A weak secret is refused
    (:func:`check_strength`)."""
    if path:
        try:
            raw, st = safefs.read_small(path, MAX_SECRET_FILE, follow=True)
        except UnsafePath as e:
            raise AuthError(f"secret file {e.reason}; point --secret-file at the secret itself") from None
        except OSError as e:
            raise AuthError(f"cannot read secret file {path}: {e.strerror}") from None
        data = raw.strip()
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise AuthError(f"secret file {path} is readable by group/others (mode "
                            f"{stat.S_IMODE(st.st_mode):o}); chmod 600 it")
        where = f"secret file {path}"
    elif os.environ.get(env):
        data = os.environ[env].encode().strip()
        where = f"${env}"
    else:
        raise AuthError(f"no cluster secret: pass --secret-file or set ${env}")
    try:
        check_strength(data)
    except AuthError as e:
        raise AuthError(f"{where}: {e.reason}") from None
    return data


def _mac(key: bytes, label: bytes, first: bytes, second: bytes, role: str) -> bytes:
    return hmac.new(key, label + first + second + role.encode(), hashlib.sha256).digest()


def _nonce(body: dict[str, Any], key: str) -> bytes:
    v = body.get(key)
    if not isinstance(v, bytes) or len(v) != NONCE_SIZE:
        raise FrameError(ErrorCode.PROTOCOL, f"handshake field {key!r} must be {NONCE_SIZE} bytes")
    return v


def client_handshake(conn: Conn, secret: bytes, *, role: str = "transfer") -> None:
    """Authenticate ``conn`` from the connecting side; raises AuthError on failure."""
    key = handshake_key(secret)
    nc = secrets.token_bytes(NONCE_SIZE)
    try:
        write_frame(conn, FrameType.HELLO, {"nonce": nc, "role": role, "kdf": KDF_ID})
        ch = read_frame(conn, expect=[FrameType.CHALLENGE])
        ns = _nonce(ch.body, "nonce")
        mac = ch.body.get("mac")
        kdf = ch.body.get("kdf")
        if kdf != KDF_ID:
            send_error(conn, ErrorCode.AUTH, f"handshake key derivation {kdf!r} is not {KDF_ID!r}")
            raise AuthError(f"peer {conn.peer} derives the handshake key differently ({kdf!r}, "
                            f"here {KDF_ID!r}): run the same Ferry version on both sides",
                            stage="handshake", peer=conn.peer)
        if not isinstance(mac, bytes) or not hmac.compare_digest(mac, _mac(key, _SERVER_LABEL, nc, ns, role)):
            send_error(conn, ErrorCode.AUTH, "server failed to prove the cluster secret")
            raise AuthError(f"peer {conn.peer} does not know the cluster secret "
                            "(wrong secret on one side, or not a Ferry node of this cluster)",
                            stage="handshake", peer=conn.peer)
        write_frame(conn, FrameType.RESPONSE, {"mac": _mac(key, _CLIENT_LABEL, ns, nc, role)})
        read_frame(conn, expect=[FrameType.AUTH_OK])
        conn.sealer = Sealer(_mac(key, _SESSION_LABEL, nc, ns, role), client=True)
    except RemoteError as e:
        raise AuthError(f"authentication refused by {conn.peer}: {e.reason}",
                        stage="handshake", peer=conn.peer) from None
    except (FrameError, PeerClosed) as e:
        raise AuthError(f"handshake with {conn.peer} failed: {e.reason}",
                        stage="handshake", peer=conn.peer) from None


def server_handshake(conn: Conn, secret: bytes, *, deadline: float | None = HANDSHAKE_DEADLINE) -> str:
    """Authenticate the connecting peer; returns its role. On failure the peer gets an
    ERROR frame (code AUTH) and AuthError is raised; nothing else was read. The whole
    handshake must end within ``deadline`` seconds (None: only the per-read timeout),
    and its frames are at most HANDSHAKE_MAX_PAYLOAD bytes. The key is derived before
    anything is read (once per process: a server derives it when it starts)."""
    key = handshake_key(secret)
    conn.set_deadline(deadline)
    try:
        return _server_handshake(conn, key)
    finally:
        conn.set_deadline(None)


def _server_handshake(conn: Conn, key: bytes) -> str:
    try:
        hello = read_frame(conn, limit=HANDSHAKE_MAX_PAYLOAD)
        if hello.type != FrameType.HELLO:
            send_error(conn, ErrorCode.AUTH, "authentication required: the first frame must be HELLO")
            raise AuthError(f"peer {conn.peer} sent frame type {hello.type} before authenticating",
                            stage="handshake", peer=conn.peer)
        nc = _nonce(hello.body, "nonce")
        role = hello.body.get("role")
        if not isinstance(role, str) or len(role) > 64:
            raise FrameError(ErrorCode.PROTOCOL, "handshake role must be a short string")
        kdf = hello.body.get("kdf")
        if kdf is not None and kdf != KDF_ID:
            send_error(conn, ErrorCode.AUTH, f"handshake key derivation {kdf!r} is not this "
                       f"server's {KDF_ID!r}: run the same Ferry version on both sides")
            raise AuthError(f"peer {conn.peer} derives the handshake key differently ({kdf!r})",
                            stage="handshake", peer=conn.peer)
        ns = secrets.token_bytes(NONCE_SIZE)
        write_frame(conn, FrameType.CHALLENGE, {"nonce": ns, "kdf": KDF_ID,
                                                "mac": _mac(key, _SERVER_LABEL, nc, ns, role)})
        resp = read_frame(conn, expect=[FrameType.RESPONSE], limit=HANDSHAKE_MAX_PAYLOAD)
        mac = resp.body.get("mac")
        if not isinstance(mac, bytes) or not hmac.compare_digest(mac, _mac(key, _CLIENT_LABEL, ns, nc, role)):
            send_error(conn, ErrorCode.AUTH, "wrong cluster secret (or a replayed handshake)")
            old = "" if kdf is not None else "; its HELLO named no key derivation (an older Ferry?)"
            raise AuthError(f"peer {conn.peer} failed authentication (wrong secret or replayed "
                            f"handshake{old})", stage="handshake", peer=conn.peer)
        write_frame(conn, FrameType.AUTH_OK, {})
        conn.sealer = Sealer(_mac(key, _SESSION_LABEL, nc, ns, role), client=False)
        return role
    except FrameError as e:
        send_error(conn, e.code, e.reason)
        raise AuthError(f"handshake with {conn.peer} failed: {e.reason}",
                        stage="handshake", peer=conn.peer) from None
    except RemoteError as e:
        raise AuthError(f"peer {conn.peer} aborted the handshake: {e.reason}",
                        stage="handshake", peer=conn.peer) from None
    except PeerClosed as e:
        raise AuthError(f"peer {conn.peer} left during the handshake: {e.reason}",
                        stage="handshake", peer=conn.peer) from None


__all__ = ["client_handshake", "server_handshake", "load_secret", "SECRET_ENV", "check_strength",
           "estimate_bits", "generate_secret", "handshake_key", "derive_key", "KDF_ID"]
