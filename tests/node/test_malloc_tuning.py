"""Node start-up keeps freed heap (glibc M_TOP_PAD): the setting is read from
FERRY_MALLOC_TOP_PAD, a bad value is reported and ignored, never fatal."""
from __future__ import annotations

import logging

import pytest

from node import process


@pytest.mark.parametrize("value", ["lots", "1.5e3", ""])
def test_bad_top_pad_is_reported_and_ignored(monkeypatch, caplog, value: str) -> None:
    monkeypatch.setenv("FERRY_MALLOC_TOP_PAD", value)
    with caplog.at_level(logging.WARNING, logger="t"):
        process._tune_malloc(logging.getLogger("t"))
    assert "FERRY_MALLOC_TOP_PAD" in caplog.text and "ignored" in caplog.text


@pytest.mark.parametrize("value", ["0", "-5", str(64 << 20), str(1 << 40)])
def test_top_pad_values_apply_or_leave_glibc_default_quietly(monkeypatch, caplog, value: str) -> None:
    calls: list[tuple[int, int]] = []

    class Libc:
        @staticmethod
        def mallopt(param: int, val: int) -> int:
            calls.append((param, val))
            return 1
    monkeypatch.setenv("FERRY_MALLOC_TOP_PAD", value)
    monkeypatch.setattr("ctypes.CDLL", lambda name: Libc)
    with caplog.at_level(logging.WARNING, logger="t"):
        process._tune_malloc(logging.getLogger("t"))
    assert caplog.text == ""
    if int(value) <= 0:
        assert calls == []                       # glibc's default kept
    else:
        assert calls == [(process.M_TOP_PAD, min(int(value), 1 << 30))]


def test_real_glibc_accepts_the_default(caplog) -> None:
    """On this (glibc) machine the real call succeeds: no warning."""
    with caplog.at_level(logging.WARNING, logger="t"):
        process._tune_malloc(logging.getLogger("t"))
    assert "refused" not in caplog.text
