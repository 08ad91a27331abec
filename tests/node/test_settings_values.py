"""Live settings: a value is finite and in range when it is set (``ferry cluster
settings set transfer.rate_limit inf`` was an OverflowError traceback), and stored
settings are applied each on its own (``config.apply_each``): one malformed value no
longer holds back the others."""
from __future__ import annotations

import pytest

from node.config import MAX_WHOLE, NodeConfig, apply_each
from node.errors import ConfigError
from node.settings import parse

CFG = NodeConfig(id="n1", data="/tmp/x")


@pytest.mark.parametrize("name, raw, says", [
    ("transfer.rate_limit", "inf", "not a finite number"),
    ("transfer.rate_limit", "-inf", "not a finite number"),
    ("transfer.rate_limit", "nan", "not a finite number"),
    ("transfer.rate_limit", "1e400", "not a finite number"),
    ("transfer.rate_limit", "1e3", "not a whole number"),
    ("transfer.rate_limit", "2.5", "not a whole number"),
    ("transfer.rate_limit", str(2**64), "at most 9223372036854775807"),
    ("transfer.concurrency", "0x10", "not an integer"),
    ("rebalance.latency_target_ms", "inf", "not a finite number"),
    ("rebalance.latency_target_ms", "NaN", "not a finite number"),
    ("checkpoint.interval_s", "1e309", "not a finite number"),
    ("checkpoint.interval_s", "100000", "checkpoint.interval_s must be a number"),
])
def test_set_refuses_what_is_not_a_finite_value_in_range(name: str, raw: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says) as e:
        parse(name, raw)
    assert name in str(e.value)


@pytest.mark.parametrize("name, raw, value", [
    ("transfer.rate_limit", "1000000", 1_000_000), ("transfer.rate_limit", " +5 ", 5),
    ("transfer.rate_limit", str(MAX_WHOLE), MAX_WHOLE),
    ("rebalance.latency_target_ms", "2.5", 2.5), ("rebalance.protect", "off", False),
    ("log_level", "debug", "debug"),
])
def test_set_takes_good_values(name: str, raw: str, value) -> None:
    assert parse(name, raw) == value


def test_each_setting_is_applied_on_its_own() -> None:
    new, refused = apply_each(CFG, {"transfer.rate_limit": "inf",     # malformed in etcd
                                    "transfer.concurrency": 7,
                                    "rebalance.protect": False,
                                    "checkpoint.interval_s": float("nan"),
                                    "no.such": 1})
    assert (new.transfer_concurrency, new.rebalance_protect) == (7, False)
    assert (new.transfer_rate_limit, new.checkpoint_interval_s) == \
        (CFG.transfer_rate_limit, CFG.checkpoint_interval_s)
    assert set(refused) == {"transfer.rate_limit", "checkpoint.interval_s", "no.such"}
    assert "transfer.rate_limit must be a whole number" in refused["transfer.rate_limit"]
    assert "unknown setting" in refused["no.such"]


def test_dependent_settings_are_applied_in_any_order() -> None:
    # min_moves 6 is above the old max_moves 4 until max_moves 8 is applied
    cfg = NodeConfig(id="n1", data="/tmp/x", rebalance_max_moves=4)
    new, refused = apply_each(cfg, {"rebalance.min_moves": 6, "rebalance.max_moves": 8})
    assert refused == {} and (new.rebalance_min_moves, new.rebalance_max_moves) == (6, 8)
    new, refused = apply_each(cfg, {"rebalance_min_moves": 6})     # field names work too
    assert list(refused) == ["rebalance_min_moves"] and new == cfg


def test_set_is_not_blocked_by_a_malformed_stored_setting() -> None:
    """The check "with the cluster's other settings" skips one the nodes refuse too."""
    from types import SimpleNamespace

    from node.settings import put

    class Store:                          # the two calls settings.put makes of etcd
        def __init__(self) -> None:
            self.kv = {"/p/settings/transfer.rate_limit": "inf",
                       "/p/settings/rebalance.max_moves": 4}

        def range_prefix(self, prefix):
            return 1, {k: SimpleNamespace(value=v) for k, v in self.kv.items()
                       if k.startswith(prefix)}

        def put(self, key, value):
            self.kv[key] = value

    etcd = Store()
    assert put(etcd, "/p", "transfer.concurrency", "8") == 8
    assert etcd.kv["/p/settings/transfer.concurrency"] == 8
    with pytest.raises(ConfigError, match="with the cluster's other settings"):
        put(etcd, "/p", "rebalance.min_moves", "6")     # still checked against max_moves 4
