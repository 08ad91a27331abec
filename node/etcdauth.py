"""etcd's access control for one Ferry cluster: ``ferry etcd setup``.

Given root access to etcd (a client certificate etcd trusts and the root user's
password file), :func:`setup` makes, for the cluster under prefix ``P``:

- the role ``ferry-<name>-node``: read and write on the range ``P/`` (every key a node
  reads or writes) and nothing else, and the user ``ferry-<name>-node`` holding it;
- the role ``ferry-<name>-reader``: read on ``P/`` only, and the user
  ``ferry-<name>-reader`` (``ferry cluster settings get``, ``reassign status``,
  ``ferry validate --control-plane``);
- the user ``root`` with the role ``root`` (etcd needs it before auth can be turned
  on), its password from the root password file (made when the file does not exist),

then turns etcd's authentication on. Each user's password is random, written to
``OUT/<user>.password`` (0600) and never printed. Running it again changes nothing that
is already in place (a user whose password file is missing gets a new password).
Root's password file stays with the operator: a node gets only its own user's file.
"""
from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass

from .control import Etcd, EtcdAccess, b64, prefix_end
from .errors import ConfigError, ControlPlaneError


@dataclass(frozen=True)
class Setup:
    prefix: str
    node_user: str
    node_role: str
    reader_user: str
    reader_role: str
    node_password_file: str
    reader_password_file: str
    root_password_file: str
    created: tuple[str, ...]          # what this run made ("user x", "role y", "auth on")


def cluster_name(prefix: str) -> str:
    """``/ferry/default`` -> ``default``: the last path segment, made safe for names."""
    last = prefix.rstrip("/").rsplit("/", 1)[-1]
    return re.sub(r"[^A-Za-z0-9_.-]", "_", last) or "cluster"


def _write_password(path: str) -> str:
    pw = secrets.token_urlsafe(24)
    os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, (pw + "\n").encode())
    finally:
        os.close(fd)
    return pw


def _refused(e: ControlPlaneError, *words: str) -> bool:
    return any(w in str(e) for w in words)


def _ensure_user(etcd: Etcd, user: str, pw_file: str, made: list[str]) -> None:
    have = os.path.exists(pw_file)
    try:
        etcd.post("/auth/user/get", {"name": user})
        exists = True
    except ControlPlaneError as e:
        if not _refused(e, "not found"):
            raise
        exists = False
    if exists and have:
        return
    if have:
        pw = EtcdAccess(user=user, password_file=pw_file).password()
    else:
        pw = _write_password(pw_file)
    if exists:
        etcd.post("/auth/user/changepw", {"name": user, "password": pw})
        made.append(f"password of user {user}")
    else:
        etcd.post("/auth/user/add", {"name": user, "password": pw})
        made.append(f"user {user}")


def _ensure_role(etcd: Etcd, role: str, prefix: str, perm: str, made: list[str]) -> None:
    try:
        etcd.post("/auth/role/add", {"name": role})
        made.append(f"role {role}")
    except ControlPlaneError as e:
        if not _refused(e, "already exists"):
            raise
    key = prefix + "/"
    etcd.post("/auth/role/grant", {"name": role, "perm": {"permType": perm, "key": b64(key),
                                                          "range_end": b64(prefix_end(key))}})


def _grant(etcd: Etcd, user: str, role: str) -> None:
    etcd.post("/auth/user/grant", {"user": user, "role": role})


def setup(endpoints: list[str], prefix: str, out_dir: str, *, ca: str | None, cert: str | None,
          key: str | None, root_password_file: str, node_user: str | None = None,
          reader_user: str | None = None, enable: bool = True) -> Setup:
    """Roles, users and auth on for the cluster under ``prefix`` (module docstring)."""
    if not prefix.startswith("/") or prefix.endswith("/"):
        raise ConfigError(f"--prefix must look like /ferry/NAME, not {prefix!r}")
    name = cluster_name(prefix)
    node_user = node_user or f"ferry-{name}-node"
    reader_user = reader_user or f"ferry-{name}-reader"
    if node_user in ("root", reader_user) or reader_user == "root":
        raise ConfigError("the node user, the reader user and root must be three different users")
    node_role, reader_role = f"ferry-{name}-node", f"ferry-{name}-reader"
    made: list[str] = []
    if not os.path.exists(root_password_file):
        _write_password(root_password_file)
        made.append(f"root password file {root_password_file}")
    etcd = Etcd(endpoints, timeout=10.0,
                access=EtcdAccess(ca, cert, key, "root", root_password_file))
    etcd._auth_off_warned = True        # auth off is what this is about to change
    # root first (auth cannot be turned on without it); before auth is on, etcd takes
    # every request without a user, after it only root's
    _ensure_user(etcd, "root", root_password_file, made)
    _grant(etcd, "root", "root")
    files = {u: os.path.join(out_dir, f"{u}.password") for u in (node_user, reader_user)}
    _ensure_role(etcd, node_role, prefix, "READWRITE", made)
    _ensure_role(etcd, reader_role, prefix, "READ", made)
    for user, role in ((node_user, node_role), (reader_user, reader_role)):
        _ensure_user(etcd, user, files[user], made)
        _grant(etcd, user, role)
    if enable:
        etcd.post("/auth/enable", {})          # (a no-op when it is on)
        if etcd.auth_was_off:
            made.append("auth on")
    return Setup(prefix, node_user, node_role, reader_user, reader_role, files[node_user],
                 files[reader_user], root_password_file, tuple(made))


__all__ = ["setup", "Setup", "cluster_name"]
