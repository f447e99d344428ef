"""`--from-record` files are untrusted input: the --help example works as printed, reading is
bounded (a file, a line), and every bad record is one error naming FILE:LINE."""
from __future__ import annotations

import json
import os

import pytest
from conftest import EXAMPLES

from ctbuild.compile.miss_records import MAX_FILE_BYTES, RecordFileError, read_records
from ctbuild.specs import Tensor


@pytest.fixture(scope="module")
def kernels() -> list:
    import sys
    sys.path.insert(0, str(EXAMPLES))
    try:
        from ctbuild.project import load_project
        return load_project(EXAMPLES / "ctbuild.toml").kernels()
    finally:
        sys.path.remove(str(EXAMPLES))


def help_example() -> str:
    from ctbuild.cli import build_parser
    parser = build_parser(only="precompile")
    sub = next(a for a in parser._actions if a.dest == "command")
    text = sub.choices["precompile"].format_help()  # type: ignore[attr-defined]
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith('{"kernel"')]
    assert len(lines) == 1, text
    return lines[0]


def test_the_help_example_plans_as_printed(tmp_path, kernels):
    from ctbuild.arch import Arch
    from ctbuild.compile.plan import make_plan
    record = tmp_path / "misses.jsonl"
    record.write_text(help_example() + "\n")
    extra, archs = read_records([str(record)], kernels)
    assert archs == ["sm_90"]
    (workload,) = extra["matmul"]
    assert workload.A == Tensor((512, 4096), "float16")  # contiguous, 256-aligned
    matmul = next(k for k in kernels if k.name == "matmul")
    plan = make_plan([matmul], [Arch("sm_90")], "fp", extra_workloads=extra)
    assert any(e.workload == workload for e in plan.entries)


def line(**fields: object) -> str:
    tensor = {"tensor": [64, 64], "dtype": "float16"}
    record = {"kernel": "matmul", "workload": {"A": tensor, "B": tensor, "C": tensor},
              "arch": "sm_90"}
    record.update(fields)
    return json.dumps(record)


def a_tensor(**fields: object) -> str:
    tensor = {"tensor": [64, 64], "dtype": "float16", **fields}
    return line(workload={"A": tensor, "B": tensor, "C": tensor})


@pytest.mark.parametrize("text, message", [
    (a_tensor(align=3), "argument A: align 3 must be a power of two of at least the element size "
                        "(2 bytes for float16)"),
    (a_tensor(align=1), "align 1 must be a power of two of at least the element size"),
    (a_tensor(strides=[1]), "argument A: 1 strides for 2 dimensions"),
    (a_tensor(tensor=[64, True]), "the shape must be a list of at most 16 whole numbers"),
    (a_tensor(tensor=[-1, 64]), "the shape must be a list"),
    (a_tensor(tensor=[2**64, 64]), "in [0, 2**63-1]"),
    (a_tensor(dtype="float17"), "unknown dtype 'float17'"),
    (a_tensor(shape=[1]), "argument A: unknown field(s) 'shape'"),
    (line(extra=1), "unknown field(s) 'extra'"),
    (line(arch="sm_12"), "unknown GPU arch 'sm_12'"),
    (line(format=7), "miss record: format 7 is not one this ctbuild reads"),
    (line(kernel=None), 'expected an object with "kernel" (str), "workload" (object)'),
    (line(workload={"A": 1}), "do not match matmul's"),
    (line(workload={"A": {"x": 1}, "B": 1, "C": 1}), "argument A: expected a tensor"),
    (line(workload={"A": 1.5, "B": [[[[[[[[[[1]]]]]]]]]], "C": 1}), "argument B[0][0][0][0][0][0][0][0]: "
                                                                   "lists nested deeper than 8"),
    ('{"kernel": "matmul", "workload": {"A": NaN}}', "NaN is not a JSON number"),
    ("[" * 50_000, "nested too deeply"),
    ('{"kernel": 1' + "0" * 5000 + "}", "not JSON"),
    ("{oops", "not JSON"),
    ("[1]", "expected a JSON object, got list"),
])
def test_each_bad_record_is_one_error_naming_file_and_line(tmp_path, kernels, text, message):
    record = tmp_path / "misses.jsonl"
    record.write_text(line() + "\n\n" + text + "\n")
    with pytest.raises(RecordFileError) as info:
        read_records([str(record)], kernels)
    error = str(info.value)
    assert error.startswith(f"--from-record {record}:3: "), error
    assert message in error and "\n" not in error, error
    assert error.endswith("(the format is in `ctbuild precompile --help`)"), error


def test_reading_is_bounded(tmp_path, kernels):
    with pytest.raises(RecordFileError, match=r"/dev/zero is a character device, not a regular file"):
        read_records(["/dev/zero"], kernels)  # refused before a byte is read
    long_line = tmp_path / "long.jsonl"
    long_line.write_text(" " * (64 * 1024 + 1))
    with pytest.raises(RecordFileError, match=r"long.jsonl:1: line longer than 64 KiB"):
        read_records([str(long_line)], kernels)
    big = tmp_path / "big.jsonl"
    big.touch()
    os.truncate(big, MAX_FILE_BYTES + 1)  # sparse: refused by its size, before it is read
    with pytest.raises(RecordFileError, match=f"{MAX_FILE_BYTES + 1} bytes, more than the {MAX_FILE_BYTES}"):
        read_records([str(big)], kernels)
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(b"\xff\xfe\n")
    with pytest.raises(RecordFileError, match=r"bin.jsonl:1: not UTF-8 text"):
        read_records([str(binary)], kernels)
    with pytest.raises(RecordFileError, match="is a directory, not a regular file"):
        read_records([str(tmp_path)], kernels)


def test_declared_alignment_must_be_a_power_of_two():
    with pytest.raises(ValueError, match="power of two"):
        Tensor((8,), "float16", align=3)
    assert Tensor((8,), "float16", align=16).align == 16
