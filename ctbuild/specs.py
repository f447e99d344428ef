"""Abstract argument specs: what a kernel will be called with, without a GPU or torch.

Workloads are declared with these so that `ctbuild plan` and `ctbuild precompile` can run in a
CPU-only container build. A `Tensor` spec quacks enough like a torch tensor (``shape``, ``dtype``,
``ndim``, ``stride()``, ``numel()``) that the same grid/args/key functions work on specs at build
time and on real tensors at run time.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence, cast

#: dtype names accepted in specs, with their width in bits (cuTile's names).
DTYPE_BITS: dict[str, int] = {
    "bool": 8, "uint8": 8, "int8": 8, "uint16": 16, "int16": 16, "uint32": 32, "int32": 32,
    "uint64": 64, "int64": 64, "float16": 16, "bfloat16": 16, "float32": 32, "float64": 64,
    "float8_e4m3fn": 8, "float8_e5m2": 8,
}
_ALIASES = {"bool_": "bool", "half": "float16", "float": "float32", "double": "float64",
            "fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "long": "int64",
            "int": "int32"}


def dtype_name(dtype: Any) -> str:
    """Normalise a dtype (str, torch.dtype, numpy dtype or cuTile DType) to cuTile's name.

    Keys computed from specs at build time and from tensors at run time must agree, so every
    dtype goes through this one function.
    """
    name = getattr(dtype, "name", None) if not isinstance(dtype, str) else dtype
    if not isinstance(name, str):
        name = str(dtype)
    name = name.removeprefix("torch.")
    name = _ALIASES.get(name, name)
    if name not in DTYPE_BITS:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(sorted(DTYPE_BITS))}")
    return name


def _is_dim(value: Any) -> bool:
    """A `ctbuild.Dim` shape entry (tested by marker: dims.py builds on this module)."""
    return getattr(value, "_ctbuild_dim", False) is True


def whole_number(value: Any) -> int | None:
    """``value`` as an int (numpy's too), None for anything else: a float, bool or string in a
    size is a mistake that ``int()`` would hide (1024.5 became 1024: a workload no call has).
    Tensor sizes and strides and `ctbuild.Dim` bounds are read through it."""
    if isinstance(value, (bool, float, str, bytes)):
        return None
    try:
        return int(operator.index(value))
    except TypeError:
        return None


def _whole(value: Any, what: str, within: Any) -> int:
    """A size or stride of a `Tensor` (`whole_number`), else the error naming it."""
    n = whole_number(value)
    if n is None:
        raise ValueError(f"Tensor {what} {value!r} in {tuple(within)!r} is not a whole number; "
                         f"give an int (or a ctbuild.Dim)")
    return n


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """C-order strides, in elements, as torch gives a fresh tensor (size-1 dims included)."""
    strides, acc = [], 1
    for dim in reversed(shape):
        strides.append(acc)
        acc *= max(dim, 1)
    return tuple(reversed(strides))


@dataclass(frozen=True)
class Tensor:
    """A tensor argument by shape, dtype, optional strides (elements) and base-address alignment.

    ``align`` is the byte alignment of the base pointer: 256 for a fresh CUDA allocation, smaller
    for a view at an offset (e.g. ``x[1:]`` of fp16 gives 2).
    """
    shape: tuple[int, ...]
    dtype: str
    strides: tuple[int, ...] | None = None
    align: int = 256

    def __post_init__(self) -> None:
        shape = tuple(d if _is_dim(d) else _whole(d, "size", self.shape) for d in self.shape)
        if any(not _is_dim(d) and d < 0 for d in shape):
            raise ValueError(f"Tensor shape {shape} has a negative dimension")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        if self.align <= 0 or self.align & (self.align - 1):
            raise ValueError(f"Tensor align must be a power of two (bytes of base-pointer "
                             f"alignment, e.g. 256 or 16), got {self.align}")
        if any(_is_dim(d) for d in shape):  # a dynamic tensor: contiguous, strides per size
            if self.strides is not None:
                raise ValueError(f"Tensor {shape}: a tensor with a Dim is contiguous; strides= "
                                 "cannot be given (declare such views as fixed shapes)")
            return
        strides = contiguous_strides(shape) if self.strides is None else tuple(
            _whole(s, "stride", self.strides) for s in self.strides)
        if len(strides) != len(shape):
            raise ValueError(f"Tensor strides {strides} do not match shape {shape}")
        object.__setattr__(self, "strides", strides)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def itemsize(self) -> int:
        return DTYPE_BITS[self.dtype] // 8

    def is_contiguous(self) -> bool:
        """Whether the strides are the row-major ones of the shape (torch's test: dims of
        size 1 may have any stride; any tensor with a size-0 dim is contiguous)."""
        assert self.strides is not None
        if 0 in self.shape:
            return True
        expected = 1
        for dim, stride in zip(reversed(self.shape), reversed(self.strides)):
            if dim != 1:
                if stride != expected:
                    return False
                expected *= dim
        return True

    def stride(self, dim: int | None = None) -> int | tuple[int, ...]:
        assert self.strides is not None
        return self.strides if dim is None else self.strides[dim]

    def size(self, dim: int | None = None) -> int | tuple[int, ...]:
        return self.shape if dim is None else self.shape[dim]

    def numel(self) -> int:
        return math.prod(self.shape)

    def to_json(self) -> dict[str, Any]:
        return {"tensor": [cast(Any, d).to_json() if _is_dim(d) else d for d in self.shape],
                "dtype": self.dtype, "strides": list(self.strides or ()), "align": self.align}

    def __repr__(self) -> str:
        extra = "" if self.strides is None or self.strides == contiguous_strides(self.shape) \
            else f", strides={self.strides}"
        extra += "" if self.align == 256 else f", align={self.align}"
        return f"Tensor({self.shape}, {self.dtype}{extra})"


@dataclass(frozen=True)
class Scalar:
    """A runtime scalar argument whose value is not known at build time (only its type matters)."""
    dtype: str = "int32"
    example: float | int | bool | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", dtype_name(self.dtype))

    def value(self) -> int | float | bool:
        """The value passed when a workload is run (tuning): the example, else a neutral one."""
        if self.example is not None:
            return self.example
        if self.dtype == "bool":
            return False
        return 1.0 if self.dtype.startswith(("float", "bfloat")) else 1

    def to_json(self) -> dict[str, Any]:
        return {"scalar": self.dtype, "example": self.example}


@dataclass(frozen=True)
class Workload(Mapping[str, Any]):
    """The call arguments of one workload, by name: ``w.A``, ``w["A"]``.

    The same class wraps real tensors at run time, so user functions see one interface.
    """
    args: dict[str, Any] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "args":  # pickle and copy ask before args is set
            raise AttributeError(name)
        try:
            return self.args[name]
        except KeyError:
            raise AttributeError(
                f"workload has no argument {name!r} (arguments: {', '.join(self.args)})"
            ) from None

    def __getitem__(self, name: str) -> Any:
        return self.args[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.args)

    def __len__(self) -> int:
        return len(self.args)

    def __hash__(self) -> int:
        # A declared workload keys the runtime's memos (through its buckets) on every new size
        # of a call: its text is made once. A workload is not changed once made.
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(describe(self))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without its hash: a text's hash differs from one process to another."""
        return {"args": self.args}

    def __repr__(self) -> str:
        return "Workload(" + ", ".join(f"{k}={v!r}" for k, v in self.args.items()) + ")"


def spec_to_json(value: Any) -> Any:
    """JSON form of one argument spec (used in plans, reports and miss records)."""
    if isinstance(value, (Tensor, Scalar)):
        return value.to_json()
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (tuple, list)):
        return [spec_to_json(v) for v in value]
    raise TypeError(f"cannot describe argument spec {value!r}")


def spec_from_json(value: Any) -> Any:
    """Inverse of `spec_to_json` (for `--from-record` files written at run time)."""
    if isinstance(value, dict) and "tensor" in value:
        return Tensor(tuple(value["tensor"]), value["dtype"],
                      tuple(value.get("strides") or ()) or None, value.get("align", 256))
    if isinstance(value, dict) and "scalar" in value:
        return Scalar(value["scalar"], value.get("example"))
    if isinstance(value, list):
        return tuple(spec_from_json(v) for v in value)
    return value


def describe(workload: Workload) -> str:
    """A short stable text of a workload, for tables and logs."""
    return ", ".join(f"{k}={v!r}" for k, v in workload.args.items())
