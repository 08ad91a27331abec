"""The executor's copy of the cluster secret (``livesource._owner_only``): the
execute bits Spark's fetch adds are dropped, a copy others can read is still refused."""
from __future__ import annotations

import os
import stat

import pytest

pytest.importorskip("pyspark")

from node import AuthFailed, load_secret  # noqa: E402
from validation.livesource import _owner_only  # noqa: E402

SECRET = b"5e8a1f47c90d3b26e4a7f01c8d5b92e6"


def _file(tmp_path, mode: int) -> str:
    p = tmp_path / "secret"
    p.write_bytes(SECRET)
    os.chmod(p, mode)
    return str(p)


def test_fetched_copy_is_made_owner_only(tmp_path) -> None:
    path = _file(tmp_path, 0o711)            # what Spark's fetch leaves of a 0600 file
    assert load_secret(_owner_only(path)) == SECRET
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o622, 0o755])
def test_copy_others_can_read_or_write_is_still_refused(tmp_path, mode: int) -> None:
    path = _file(tmp_path, mode)
    with pytest.raises(AuthFailed, match=f"mode {mode:o}"):
        load_secret(_owner_only(path))
    assert stat.S_IMODE(os.stat(path).st_mode) == mode
