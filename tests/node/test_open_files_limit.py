"""Node start-up raises the soft limit of open files to the hard limit and logs it."""
from __future__ import annotations

import logging
import resource

import pytest

from node import process


def test_soft_limit_is_raised_to_the_hard_limit_and_logged(caplog) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 256:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} leaves no room to lower the soft one")
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard))
    try:
        with caplog.at_level(logging.INFO, logger="t"):
            got = process.raise_open_files_limit(logging.getLogger("t"))
        now = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        assert got == now > 128
        if hard != resource.RLIM_INFINITY:
            assert now == hard
        assert f"open files limit {now}" in caplog.text
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
