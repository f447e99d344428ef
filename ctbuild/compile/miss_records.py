"""``ctbuild precompile --from-record FILE``: the misses a serving process recorded
(``CTBUILD_RECORD``), read back as workloads to plan.

A record file is input from elsewhere (a log volume, another team's service), so it is read as
untrusted: under a size cap and a line-length cap (a wrong path such as ``/dev/zero`` fails at
once instead of growing the process; a FIFO or device is refused before it is read), and each
line is checked against the miss-record schema before anything is built from it. A bad line is
one error naming ``FILE:LINE``, what is wrong and what to do. One line::

    {"kernel": "matmul", "arch": "sm_90",
     "workload": {"A": {"tensor": [4096, 4096], "dtype": "float16"}, ...}}

A tensor is ``{"tensor": shape, "dtype": name}`` with optional ``"strides"`` (elements; absent:
contiguous) and ``"align"`` (bytes of base-pointer alignment: a power of two, at least the element
size; absent: 256); a scalar is ``{"scalar": dtype, "example": value}``; a list holds such
specs; anything else is a constant (a number, a bool, a string or null).
"""
from __future__ import annotations

import itertools
import json
import math
from typing import TYPE_CHECKING, Any, Iterator

from ..arch import Arch
from ..cache.user_files import FileTooLargeError, NotAFileError, open_regular
from ..records import MissRecord, RecordFormatError
from ..specs import DTYPE_BITS, Scalar, Tensor, Workload, dtype_name

if TYPE_CHECKING:
    from ..declare import TunedKernel

#: Bytes one record file may hold (a service records each distinct miss once: real files are
#: kilobytes).
MAX_FILE_BYTES = 16 * 2**20
#: Bytes one line may hold (a record of a dozen 8-D tensors is about 2 KiB).
MAX_LINE_BYTES = 64 * 2**10
#: Dimensions one tensor may have, and how deeply lists of specs may nest.
MAX_NDIM = 16
MAX_NESTING = 8
INT64_MAX = 2**63 - 1
TOP_FIELDS = ("kernel", "workload", "arch", "format")
FIX = "fix or delete that line (the format is in `ctbuild precompile --help`)"


class RecordFileError(ValueError):
    """A --from-record file is unreadable, too large or holds a malformed record."""


class _BadRecord(ValueError):
    """What is wrong with one record (the reader adds FILE:LINE)."""


def read_records(files: list[str], kernels: list[TunedKernel]
                 ) -> tuple[dict[str, list[Workload]], list[Arch]]:
    """Workloads per kernel name, and the archs, from record files (deduplicated, in order)."""
    by_name = {k.name: k for k in kernels}
    extra: dict[str, list[Workload]] = {}
    seen: set[str] = set()
    archs: list[Arch] = []
    for file in files:
        for n, text in _lines(file):
            try:
                name, workload, arch, ident = _parse(text, by_name)
            except _BadRecord as exc:
                raise RecordFileError(f"--from-record {file}:{n}: {exc}; {FIX}") from None
            if arch is not None and arch not in archs:
                archs.append(arch)
            if ident not in seen:
                seen.add(ident)
                extra.setdefault(name, []).append(workload)
    return extra, archs


def _lines(file: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of each non-blank line, read under the caps."""
    total = 0
    try:
        with open_regular(file, limit=MAX_FILE_BYTES, what="a record file") as stream:
            for n in itertools.count(1):
                raw = stream.readline(MAX_LINE_BYTES + 1)
                if not raw:
                    return
                total += len(raw)
                if len(raw) > MAX_LINE_BYTES:
                    raise RecordFileError(
                        f"--from-record {file}:{n}: line longer than {MAX_LINE_BYTES // 1024} KiB: "
                        "not a record file written by CTBUILD_RECORD; check the path")
                if total > MAX_FILE_BYTES:
                    raise RecordFileError(
                        f"--from-record {file}: larger than {MAX_FILE_BYTES // 2**20} MiB: "
                        "not a record file written by CTBUILD_RECORD (those hold each distinct "
                        "miss once); check the path, or split the file")
                try:
                    text = raw.decode()
                except UnicodeDecodeError:
                    raise RecordFileError(f"--from-record {file}:{n}: not UTF-8 text; {FIX}"
                                          ) from None
                if text.strip():
                    yield n, text
    except OSError as exc:
        raise RecordFileError(f"--from-record {file}: cannot read: {exc.strerror or exc}; "
                              "check the path") from None
    except (NotAFileError, FileTooLargeError) as exc:  # a FIFO would block, /dev/zero not end
        raise RecordFileError(f"--from-record {exc}: give the path of a file CTBUILD_RECORD "
                              "wrote") from None


def _parse(text: str, by_name: dict[str, TunedKernel]
           ) -> tuple[str, Workload, Arch | None, str]:
    """(kernel name, workload, arch, identity for deduplication) of one line."""
    try:
        obj = json.loads(text, parse_constant=_no_constant)
    except _BadRecord:
        raise
    except ValueError as exc:  # malformed, or a number of thousands of digits
        raise _BadRecord(f"not JSON: {exc}") from None
    except RecursionError:
        raise _BadRecord("not a record: JSON nested too deeply") from None
    if not isinstance(obj, dict):
        raise _BadRecord(f"expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - set(TOP_FIELDS))
    if unknown:
        raise _BadRecord(f"unknown field(s) {', '.join(map(repr, unknown))} (a record has "
                         f"{', '.join(TOP_FIELDS)})")
    try:
        miss = MissRecord.from_json(obj)
    except RecordFormatError as exc:
        raise _BadRecord(str(exc)) from None
    name, workload = miss.kernel, miss.workload
    if not name:
        raise _BadRecord('"kernel" must name a kernel (it is empty)')
    kernel = by_name.get(name)
    if kernel is None:
        raise _BadRecord(f"no kernel named {name!r} in this project (kernels: "
                         f"{', '.join(sorted(by_name))})")
    if set(workload) != set(kernel.params):
        raise _BadRecord(f"workload arguments {sorted(workload)} do not match {name}'s "
                         f"({', '.join(kernel.params)})")
    arch = _arch(miss.arch)
    args = {p: _spec(workload[p], p, 0) for p in kernel.params}
    return name, Workload(args), arch, json.dumps([name, workload], sort_keys=True)


def _no_constant(word: str) -> Any:
    raise _BadRecord(f"{word} is not a JSON number")


def _arch(value: Any) -> Arch | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise _BadRecord(f'"arch" must be a string such as "sm_90" or null, got {value!r}')
    try:
        return Arch(value)
    except ValueError as exc:
        raise _BadRecord(str(exc)) from None


def _spec(value: Any, where: str, depth: int) -> Any:
    """The spec of one argument, checked."""
    if isinstance(value, dict) and "tensor" in value:
        return _tensor(value, where)
    if isinstance(value, dict) and "scalar" in value:
        return _scalar(value, where)
    if isinstance(value, list):
        if depth >= MAX_NESTING:
            raise _BadRecord(f"argument {where}: lists nested deeper than {MAX_NESTING}")
        return tuple(_spec(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value))
    if isinstance(value, float) and not math.isfinite(value):
        raise _BadRecord(f"argument {where}: {value} is not a finite number")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise _BadRecord(f'argument {where}: expected a tensor {{"tensor": [...], "dtype": ...}}, '
                     'a scalar {"scalar": dtype}, a list or a constant')


def _fields(value: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise _BadRecord(f"argument {where}: unknown field(s) {', '.join(map(repr, unknown))} "
                         f"(allowed: {', '.join(allowed)})")


def _ints(value: Any, where: str, what: str, low: int) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > MAX_NDIM or \
            not all(type(v) is int and low <= v <= INT64_MAX for v in value):
        raise _BadRecord(f"argument {where}: {what} must be a list of at most {MAX_NDIM} whole "
                         f"numbers in [{low}, 2**63-1], got {json.dumps(value)[:80]}")
    return tuple(value)


def _tensor(value: dict[str, Any], where: str) -> Tensor:
    _fields(value, ("tensor", "dtype", "strides", "align"), where)
    shape = _ints(value["tensor"], where, "the shape", 0)
    dtype = _dtype(value.get("dtype"), where)
    strides = value.get("strides")
    if strides is not None:
        strides = _ints(strides, where, "strides", -INT64_MAX)
        if len(strides) != len(shape):
            raise _BadRecord(f"argument {where}: {len(strides)} strides for {len(shape)} "
                             "dimensions")
    align = value.get("align", 256)
    size = DTYPE_BITS[dtype] // 8
    if type(align) is not int or align < size or align & (align - 1):
        raise _BadRecord(f"argument {where}: align {json.dumps(align)} must be a power of two of "
                         f"at least the element size ({size} bytes for {dtype})")
    return Tensor(shape, dtype, strides or None, align)


def _scalar(value: dict[str, Any], where: str) -> Scalar:
    _fields(value, ("scalar", "example"), where)
    example = value.get("example")
    if example is not None and (not isinstance(example, (bool, int, float))
                                or isinstance(example, float) and not math.isfinite(example)):
        raise _BadRecord(f"argument {where}: a scalar's example must be a number, a bool or "
                         f"null, got {json.dumps(example)[:80]}")
    return Scalar(_dtype(value["scalar"], where), example)


def _dtype(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise _BadRecord(f'argument {where}: "dtype" must be a dtype name such as "float16"')
    try:
        return dtype_name(value)
    except ValueError as exc:
        raise _BadRecord(f"argument {where}: {exc}") from None
