"""``ferry validate --expected`` with files it cannot use, and Spark errors in messages:
an error of ONE line naming the file, the column and an example,
exit status 2, never a mismatch (1) or a Java stack trace."""
from __future__ import annotations

import os
import subprocess

import pytest

from validation import ExpectedFileError, ValidationError, validate
from validation.errors import short_error

from validation_pages import entries, write_node

BAD_EXPECTED = [
    ("partition-text", b'{"partition": "abc", "key": "a", "value": "b"}\n',
     "column partition holds string values such as 'abc'"),
    ("partition-text-later", b'{"partition": 1, "key": "a", "value": "b"}\n'
                             b'{"partition": "x", "key": "c", "value": "d"}\n', "such as 'x'"),
    ("partition-negative", b'{"partition": -3, "key": "a", "value": "b"}\n',
     "the row with key 'a' has partition -3"),
    ("partition-too-big", b'{"partition": 99999999999, "key": "a", "value": "b"}\n',
     "has partition 99999999999"),
    ("partition-fraction", b'{"partition": 1.5, "key": "a", "value": "b"}\n',
     "holds double values such as 1.5"),
    ("partition-null", b'{"partition": null, "key": "a", "value": "b"}\n', "null on every row"),
    ("partition-missing-on-a-row", b'{"partition": 1, "key": "a", "value": "b"}\n'
                                   b'{"key": "c", "value": "d"}\n', "the row with key 'c' has partition None"),
    ("key-object", b'{"partition": 1, "key": {"x": 1}, "value": "b"}\n', "column key holds struct"),
    ("value-hash-text", b'{"partition": 1, "key": "a", "value_hash": "zz"}\n',
     "column value_hash holds string values such as 'zz'"),
    ("cache-number", b'{"cache": 5, "partition": 1, "key": "a", "value": "b"}\n',
     "column cache holds bigint"),
    ("malformed-line-2", b'{"partition": 1, "key": "a", "value": "b"}\n{nope\n', "line 2, column 2"),
    ("not-an-object", b'{"partition": 1, "key": "a", "value": "b"}\n[1]\n', "line 2 is not a JSON object"),
]


@pytest.fixture(scope="module")
def node_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("node")
    return write_node(str(root / "a"), "users", {p: entries(p, 5) for p in range(2)})


@pytest.mark.parametrize("content, needle", [b[1:] for b in BAD_EXPECTED],
                         ids=[b[0] for b in BAD_EXPECTED])
def test_unusable_expected_files_are_one_line_errors(spark, node_dir, tmp_path, content, needle):
    path = tmp_path / "expected.jsonl"
    path.write_bytes(content)
    with pytest.raises(ExpectedFileError) as err:
        validate([node_dir], spark=spark, expected=str(path))
    msg = str(err.value)
    assert needle in msg and str(path) in msg and "\n" not in msg, msg


def test_a_file_that_is_not_parquet_says_so_in_one_line(spark, node_dir, tmp_path):
    path = tmp_path / "expected.parquet"
    path.write_bytes(b"not parquet")
    with pytest.raises(ExpectedFileError) as err:
        validate([node_dir], spark=spark, expected=str(path))
    msg = str(err.value)
    assert "\n" not in msg and "\tat " not in msg and len(msg) < 1000, msg
    assert "is not a Parquet file" in msg and msg.startswith(f"cannot read expected file {path} as Parquet")


def test_a_failed_export_is_one_line(spark, node_dir, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ValidationError) as err:
        validate([node_dir], spark=spark, export=str(blocker / "out"))
    msg = str(err.value)
    assert msg.startswith(f"cannot export Parquet to {blocker / 'out'}: ")
    assert "\n" not in msg and "\tat " not in msg and len(msg) < 1000, msg


JAVA = ("An error occurred while calling o1962.parquet.\n"
        ": org.apache.spark.SparkException: [FAILED_READ_FILE.CANNOT_READ_FILE_FOOTER] "
        "Encountered error while reading file file:/x.parquet. Could not read footer.\n"
        "If not, please convert it to a valid format.\n"
        + "".join(f"\tat org.apache.spark.Frame{i}.run(Frame.scala:{i})\n" for i in range(150))
        + "Caused by: java.lang.RuntimeException: file:/x.parquet is not a Parquet file "
          "(length is too low: 11)\n"
        + "".join(f"\tat org.apache.parquet.F{i}(F.java:{i})\n" for i in range(10))
        + "\t... 9 more\n")


def test_short_error_keeps_the_first_meaningful_line_and_the_cause():
    assert len(JAVA.splitlines()) > 160
    assert short_error(RuntimeError(JAVA)) == (
        "[FAILED_READ_FILE.CANNOT_READ_FILE_FOOTER] Encountered error while reading file "
        "file:/x.parquet. Could not read footer. (cause: file:/x.parquet is not a Parquet file "
        "(length is too low: 11))")
    assert short_error(ValueError("plain")) == "plain"


@pytest.mark.slow
def test_ferry_validate_exits_2_for_an_unusable_expected_file(py_env, python, node_dir, tmp_path):
    path = tmp_path / "expected.jsonl"
    path.write_text('{"partition": "abc", "key": "k0-1", "value": "v"}\n')
    r = subprocess.run([python, "-m", "ferry", "validate", node_dir, "--master", "local[2]",
                        "--expected", str(path)], env=py_env, capture_output=True, text=True,
                       timeout=300, cwd=os.path.dirname(node_dir))
    assert r.returncode == 2, (r.stdout, r.stderr[-3000:])
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("ferry validate:")]
    assert len(errors) == 1 and "column partition holds string values such as 'abc'" in errors[0]
    assert "Traceback" not in r.stderr and "\tat org." not in r.stderr
