"""Encrypted mode: reach a supplier through an SSH server with paramiko.

The demander opens an SSH connection to ``user@host`` (host key checked against
known_hosts unless told otherwise, public-key auth) and a ``direct-tcpip`` channel to
the supplier agent's address as seen from that host. The transfer protocol then runs
unchanged over the channel (same manifest, checksums, resume); the data goes in
chunks through the channel, because encryption needs the bytes in user space, so no
zero-copy on this path (the seed's "Phase-2" remark on SSL).

One SSH connection carries one channel per fetch; AES-GCM is preferred because it is
the fastest cipher paramiko and OpenSSH share.
"""
from __future__ import annotations

import os
import socket
import threading
from typing import Any, Callable

from .errors import AuthError, PeerUnreachable, SSHError
from .transport import ChannelConn

# Receive window: big enough to keep a fast link busy across the round trip;
# paramiko's 2 MiB default stalls the sender on every window update.
WINDOW = 16 << 20
# Largest packet we accept: fewer, larger packets mean less per-packet Python work in
# paramiko (OpenSSH's own ceiling is 256 KiB per packet).
MAX_PACKET = 128 << 10
PREFERRED_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "aes128-ctr")


class SSHTunnel:
    """``SSHTunnel("root", "127.0.0.1", port=2222, key_filename=..., known_hosts=...)``
    then ``connector(host, port)`` gives the Demander a ``connect`` callable."""

    def __init__(self, user: str, host: str, port: int = 22, *, key_filename: str | None = None,
                 known_hosts: str | None = None, check_host_key: bool = True,
                 timeout: float = 15.0) -> None:
        self.user, self.host, self.port = user, host, port
        self.key_filename = key_filename
        self.known_hosts = known_hosts or os.path.expanduser("~/.ssh/known_hosts")
        self.check_host_key = check_host_key
        self.timeout = timeout
        self._transport: Any = None
        self._lock = threading.Lock()

    @classmethod
    def parse(cls, spec: str, **kw: Any) -> "SSHTunnel":
        """``user@host[:port]``."""
        user, at, hostport = spec.rpartition("@")
        if not at or not user or not hostport:
            raise SSHError(f"--ssh {spec!r}: use USER@HOST[:PORT]")
        host, _, port = hostport.partition(":")
        return cls(user, host, int(port) if port else 22, **kw)

    @property
    def name(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    def _open(self) -> Any:
        import paramiko   # heavy import, only for SSH mode

        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        except OSError as e:
            raise PeerUnreachable(f"cannot reach SSH server {self.host}:{self.port}: {e.strerror or e}",
                                  peer=self.name) from None
        t = paramiko.Transport(sock)
        opts = t.get_security_options()
        prefer = [c for c in PREFERRED_CIPHERS if c in opts.ciphers]
        opts.ciphers = tuple(prefer + [c for c in opts.ciphers if c not in prefer])
        try:
            t.start_client(timeout=self.timeout)
            self._check_host_key(t.get_remote_server_key())
            self._authenticate(t, paramiko)
        except paramiko.SSHException as e:
            t.close()
            raise SSHError(f"SSH connection to {self.name} failed: {e}", peer=self.name) from None
        except BaseException:
            t.close()
            raise
        return t

    def _check_host_key(self, key: Any) -> None:
        if not self.check_host_key:
            return
        import paramiko

        hk = paramiko.HostKeys()
        try:
            hk.load(self.known_hosts)
        except FileNotFoundError:
            raise SSHError(f"known_hosts file {self.known_hosts} does not exist; cannot check the host "
                           f"key of {self.host} (add it, or disable host key checking)", peer=self.name) from None
        name = self.host if self.port == 22 else f"[{self.host}]:{self.port}"
        entry = hk.lookup(name)
        if entry is None or key.get_name() not in entry:
            raise SSHError(f"host {name} is not in {self.known_hosts} with a {key.get_name()} key; "
                           "refusing to connect (add its key with ssh-keyscan after checking it)",
                           peer=self.name)
        if entry[key.get_name()] != key:
            raise SSHError(f"HOST KEY MISMATCH for {name}: the server's {key.get_name()} key differs from "
                           f"{self.known_hosts}; refusing to connect (possible man-in-the-middle)",
                           peer=self.name)

    def _authenticate(self, t: Any, paramiko: Any) -> None:
        paths = [self.key_filename] if self.key_filename else [
            os.path.expanduser(f"~/.ssh/{n}") for n in ("id_ed25519", "id_ecdsa", "id_rsa")]
        tried = []
        for path in paths:
            if not path or not os.path.exists(path):
                continue
            try:
                key = paramiko.PKey.from_path(path)
                t.auth_publickey(self.user, key)
                if t.is_authenticated():
                    return
            except paramiko.AuthenticationException:
                tried.append(path)
            except (paramiko.SSHException, OSError, ValueError) as e:
                tried.append(f"{path} ({e})")
        raise AuthError(f"SSH public-key authentication as {self.user} on {self.host}:{self.port} "
                        f"failed (tried {', '.join(tried) or 'no key files'})", peer=self.name)

    def connector(self, target_host: str, target_port: int) -> Callable[[], ChannelConn]:
        def connect() -> ChannelConn:
            return self.open_channel(target_host, target_port)
        return connect

    def open_channel(self, target_host: str, target_port: int) -> ChannelConn:
        with self._lock:
            if self._transport is None or not self._transport.is_active():
                self._transport = self._open()
            t = self._transport
        import paramiko
        try:
            chan = t.open_channel("direct-tcpip", (target_host, target_port), ("127.0.0.1", 0),
                                  window_size=WINDOW, max_packet_size=MAX_PACKET, timeout=self.timeout)
        except (paramiko.SSHException, EOFError) as e:
            raise PeerUnreachable(f"SSH server {self.name} could not open a tunnel to "
                                  f"{target_host}:{target_port}: {e}", peer=self.name) from None
        return ChannelConn(chan, f"{target_host}:{target_port} via ssh {self.name}")

    def close(self) -> None:
        with self._lock:
            if self._transport is not None:
                self._transport.close()
                self._transport = None

    def __enter__(self) -> "SSHTunnel":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
