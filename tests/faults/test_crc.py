"""faults.crc: the crc32c package's function, loaded without the package's import (whose
version lookup through importlib.metadata cost a node 140-320 ms at start)."""
from __future__ import annotations

import subprocess
import sys

import crc32c as package

from faults.crc import crc32c


def test_the_same_function_as_the_package() -> None:
    for data in (b"", b"a", b"123456789", bytes(range(256)) * 33):
        assert crc32c(data) == package.crc32c(data)
        assert crc32c(data[7:], crc32c(data[:7])) == package.crc32c(data)
    assert crc32c(b"123456789") == 0xE3069283                # the standard check value
    assert crc32c(memoryview(b"abcdef")[1:]) == package.crc32c(b"bcdef")


def test_it_loads_without_the_package_and_the_package_reuses_it() -> None:
    code = ("import sys\n"
            "from faults.crc import crc32c\n"
            "assert crc32c(b'123456789') == 0xE3069283\n"
            "assert 'crc32c' not in sys.modules, 'the package was imported'\n"
            "assert 'importlib.metadata' not in sys.modules\n"
            "m = sys.modules['crc32c._crc32c']\n"
            "import crc32c\n"
            "assert sys.modules['crc32c._crc32c'] is m and crc32c.crc32c(b'x') == m.crc32c(b'x')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_the_package_imported_first_is_used_as_it_is() -> None:
    code = ("import crc32c, sys\n"
            "from faults.crc import crc32c as f\n"
            "assert f is crc32c.crc32c\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
