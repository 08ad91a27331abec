"""Live, cluster-wide settings in the control plane (``P/settings/<name>``).

``ferry cluster settings get/set`` writes them; every node watches them
(:mod:`node.membership` applies a change through ``Node.apply_live_config``).
A value is read as its key's kind (node/config.py ``Setting``) and checked the same
way the node's config file is before it is stored.
"""
from __future__ import annotations

import math

from .config import BY_KEY, NodeConfig, apply_each, with_overrides
from .control import Etcd
from .errors import ConfigError
from .jsonvalue import Json, JsonDoc
from .membership import SETTINGS

DEFAULTS = NodeConfig(id="x", data="/")
_BOOLS = {"on": True, "true": True, "1": True, "yes": True,
          "off": False, "false": False, "0": False, "no": False}


def parse(name: str, raw: str) -> Json:
    fld = SETTINGS.get(name)
    if fld is None:
        raise ConfigError(f"unknown setting {name!r}; live settings: {', '.join(sorted(SETTINGS))}")
    kind = BY_KEY[name].kind
    if kind == "bool":              # bool("off") would be True
        word = raw.strip().lower()
        if word not in _BOOLS:
            raise ConfigError(f"setting {name}: {raw!r} is not on/off (also true/false, 1/0, yes/no)")
        return _BOOLS[word]
    val: Json = _number(name, raw, whole=kind == "whole") if kind in ("whole", "number") else raw
    with_overrides(DEFAULTS, **{fld: val})        # the same checks as the config file
    return val


def _number(name: str, raw: str, *, whole: bool) -> int | float:
    """``raw`` as a finite number (a whole one for a count): ``inf``, ``nan`` and
    ``1e400`` are refused here, with the setting's name, not as a traceback."""
    text = raw.strip()
    try:
        num = float(text)
    except ValueError:
        raise ConfigError(f"setting {name}: {raw!r} is not a{'n integer' if whole else ' number'}") from None
    if not math.isfinite(num):
        raise ConfigError(f"setting {name}: {raw!r} is not a finite number")
    if not whole:
        return num
    try:
        return int(text.lstrip("+"))      # exact, however many digits
    except ValueError:
        raise ConfigError(f"setting {name}: {raw!r} is not a whole number") from None


def put(etcd: Etcd, prefix: str, name: str, raw: str) -> Json:
    val = parse(name, raw)
    # checked with the other stored settings too (rebalance.min_moves <= max_moves)
    # (a malformed stored one, refused by the nodes too, does not block this one)
    others = {n: d["value"] for n, d in current(etcd, prefix).items() if d["set"] and n != name}
    base, _refused = apply_each(DEFAULTS, others)
    try:
        with_overrides(base, **{SETTINGS[name]: val})
    except ConfigError as e:
        raise ConfigError(f"setting {name} = {raw}: {e} (with the cluster's other settings)") from None
    etcd.put(f"{prefix}/settings/{name}", val)
    return val


def current(etcd: Etcd, prefix: str) -> dict[str, JsonDoc]:
    _, kvs = etcd.range_prefix(f"{prefix}/settings/")
    out = {}
    for name, fld in SETTINGS.items():
        kv = kvs.get(f"{prefix}/settings/{name}")
        out[name] = {"value": kv.value if kv else getattr(DEFAULTS, fld), "set": kv is not None}
    return out
