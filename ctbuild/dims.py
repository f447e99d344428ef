"""Dynamic dimensions in workloads: ``Tensor((Dim("M", 1, 8192), 4096), "float16")``.

Serving traffic varies in batch size, token count or sequence length. A `Dim` names such a size
and its range; the same name in several tensors of one workload is the same size. The build
splits each range into tuning buckets (default: powers of two within the range), tunes each
bucket at a representative size (the bucket's upper bound) and keys the tuning record by that
representative, so every size of a bucket shares one winner. Which CUBINs cover the sizes in
between is decided by `ctbuild.signature_classes`.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, NamedTuple, Sequence

from .keys import pow2
from .specs import Tensor, Workload, whole_number

#: The largest size any cuTile index can hold (an int64 index: ``ct.IndexedWithInt64``);
#: without that annotation sizes above 2**31 - 1 fail at launch, and grids are checked at plan.
MAX_INDEX = 2**63 - 1


def _size(dim: str, what: str, value: Any) -> int:
    """A whole number of elements (`whole_number`), else the error naming the Dim."""
    n = whole_number(value)
    if n is None:
        raise ValueError(f"Dim {dim!r}: {what} must be an int, got {value!r} "
                         f"({type(value).__name__})")
    return n


@dataclass(frozen=True)
class Dim:
    """A size that varies per call within ``[lo, hi]``; ``buckets`` are the upper bounds of the
    tuning buckets (default: the powers of two within the range, and ``hi``)."""
    name: str
    lo: int
    hi: int
    buckets: tuple[int, ...] | None = None
    _ctbuild_dim = True  # how `Tensor` recognises a Dim entry without importing this module

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"Dim name must be an identifier, got {self.name!r}")
        lo, hi = _size(self.name, "lo", self.lo), _size(self.name, "hi", self.hi)
        if lo < 1 or hi < lo:
            raise ValueError(f"Dim {self.name!r}: need 1 <= lo <= hi, got lo={lo}, hi={hi}")
        if hi > MAX_INDEX:
            raise ValueError(f"Dim {self.name!r}: hi={hi} is above cuTile's index limit "
                             f"{MAX_INDEX} (2**63 - 1); give a real upper bound")
        object.__setattr__(self, "lo", lo)
        object.__setattr__(self, "hi", hi)
        if self.buckets is None:
            bounds, b = [], pow2(lo)
            while b < hi:
                bounds.append(b)
                b *= 2
            bounds.append(hi)
        else:
            if isinstance(self.buckets, (str, bytes)) or not hasattr(self.buckets, "__iter__"):
                raise ValueError(f"Dim {self.name!r}: buckets must be a list of sizes, "
                                 f"got {self.buckets!r}")
            bounds = sorted({_size(self.name, "bucket bound", b) for b in self.buckets} | {hi})
            if bounds[0] < lo:
                raise ValueError(f"Dim {self.name!r}: bucket bound {bounds[0]} is below lo={lo}")
            if bounds[-1] > hi:
                raise ValueError(f"Dim {self.name!r}: bucket bound {bounds[-1]} is above hi={hi}")
        object.__setattr__(self, "buckets", tuple(bounds))

    def bucket_of(self, size: int) -> int | None:
        """The representative (upper bound) of the bucket holding ``size``; None if out of range."""
        if not self.lo <= size <= self.hi:
            return None
        assert self.buckets is not None
        return next(b for b in self.buckets if b >= size)

    def to_json(self) -> dict[str, Any]:
        return {"dim": self.name, "lo": self.lo, "hi": self.hi, "buckets": list(self.buckets or ())}

    def __repr__(self) -> str:
        return f"Dim({self.name!r}, {self.lo}, {self.hi})"

    def source(self) -> str:
        """Python that makes this Dim again, ``buckets=`` included where they are not the
        default: what a fix to paste and a message telling two Dims apart must show (the
        short `repr` drops them, and a pasted Dim without them tunes other buckets)."""
        default = Dim(self.name, self.lo, self.hi).buckets
        extra = "" if self.buckets == default else f", buckets={self.buckets}"
        return f"Dim({self.name!r}, {self.lo}, {self.hi}{extra})"

    def widened(self, size: int) -> Dim:
        """This Dim with its range grown to hold ``size``; declared buckets are kept (the new
        bound becomes the last one), default ones stay the default of the new range."""
        lo, hi = min(self.lo, size), max(self.hi, size)
        custom = self.buckets != Dim(self.name, self.lo, self.hi).buckets
        return Dim(self.name, lo, hi, self.buckets if custom else None)


def is_dynamic_tensor(value: Any) -> bool:
    return isinstance(value, Tensor) and any(isinstance(d, Dim) for d in value.shape)


def dims_of(w: Mapping[str, Any]) -> dict[str, Dim]:
    """The dynamic dims of a workload by name (a name used with two ranges is an error)."""
    out: dict[str, Dim] = {}
    for value in w.values():
        if isinstance(value, Tensor):
            for d in value.shape:
                if isinstance(d, Dim):
                    if d.name in out and out[d.name] != d:
                        raise ValueError(f"Dim {d.name!r} is declared twice, differently: "
                                         f"{out[d.name].source()} and {d.source()}; declare "
                                         f"it once ({d.name} = Dim(...)) and use that in "
                                         "every tensor")
                    out[d.name] = d
    return out


class DynamicPositions(NamedTuple):
    """Which dims of a tensor argument vary: its shape dims, and the stride dims whose
    contiguous stride is a product involving a varying size. A NamedTuple: made at import
    (docs/architecture.md)."""
    shape: tuple[int, ...]
    stride: tuple[int, ...]


def dynamic_positions(w: Mapping[str, Any]) -> dict[str, DynamicPositions]:
    """Per tensor argument with a `Dim`, the positions that vary across the range."""
    out = {}
    for name, value in w.items():
        if is_dynamic_tensor(value):
            shape = tuple(i for i, d in enumerate(value.shape) if isinstance(d, Dim))
            stride = tuple(i for i in range(value.ndim) if any(j > i for j in shape))
            out[name] = DynamicPositions(shape, stride)
    return out


def concretize(w: Mapping[str, Any], sizes: Mapping[str, int]) -> Workload:
    """The workload with every `Dim` replaced by its size in ``sizes`` (contiguous tensors)."""
    def one(value: Any) -> Any:
        if is_dynamic_tensor(value):
            shape = tuple(sizes[d.name] if isinstance(d, Dim) else d for d in value.shape)
            return Tensor(shape, value.dtype, None, value.align)
        return value
    return Workload({k: one(v) for k, v in w.items()})


@dataclass(frozen=True)
class Bucket:
    """One tuning bucket of a declared dynamic workload: the representative sizes per Dim
    (``floor``: the smallest sizes it holds, where they are not the declared bound below plus
    one: a sub-bucket of a refined bucket)."""
    declared: Workload
    sizes: tuple[tuple[str, int], ...]
    floor: tuple[tuple[str, int], ...] | None = None

    @property
    def representative(self) -> Workload:
        return concretize(self.declared, dict(self.sizes))

    def lower_bounds(self) -> dict[str, int]:
        """Per Dim, the smallest size that falls in this bucket (the bound below plus one, or
        the Dim's ``lo``; the ``floor`` where it has one)."""
        if self.floor is not None:
            return dict(self.floor)
        dims = dims_of(self.declared)
        out = {}
        for name, top in self.sizes:
            bounds = list(dims[name].buckets or ())
            i = bounds.index(top)
            out[name] = bounds[i - 1] + 1 if i > 0 else dims[name].lo
        return out

    def to_json(self) -> dict[str, int]:
        return dict(self.sizes)


def buckets(w: Workload) -> Iterator[Bucket]:
    """Every bucket combination of a dynamic workload (the cross product over its dims)."""
    dims = dims_of(w)
    names = sorted(dims)
    for combo in itertools.product(*(dims[n].buckets or () for n in names)):
        yield Bucket(w, tuple(zip(names, combo)))


def match(declared: Workload, call: Mapping[str, Any]) -> dict[str, int] | None:
    """The sizes of ``declared``'s Dims in a call (given as specs), or None when the call does
    not fit the declaration: other names, ranks, dtypes, static sizes or constant values, a
    size out of range, or one Dim with two sizes. Strides and alignment are not compared (the
    CUBIN lookup judges those)."""
    if set(declared) != set(call):
        return None
    sizes: dict[str, int] = {}
    for name, spec in declared.items():
        value = call[name]
        if isinstance(spec, Tensor):
            if not isinstance(value, Tensor) or value.dtype != spec.dtype or \
                    value.ndim != spec.ndim:
                return None
            for d, n in zip(spec.shape, value.shape):
                if isinstance(d, Dim):
                    if not d.lo <= n <= d.hi or sizes.setdefault(d.name, n) != n:
                        return None
                elif d != n:
                    return None
        elif type(spec) is not type(value) or (not hasattr(spec, "dtype") and spec != value):
            return None
        elif hasattr(spec, "dtype") and spec.dtype != value.dtype:
            return None
    return sizes


def find_bucket(declared: Sequence[Workload], call: Mapping[str, Any]) -> Bucket | None:
    """The bucket of the first declared dynamic workload the call fits."""
    for w in declared:
        sizes = match(w, call)
        if sizes is None:
            continue
        dims = dims_of(w)
        reps = {n: dims[n].bucket_of(s) for n, s in sizes.items()}
        return Bucket(w, tuple(sorted((n, int(r)) for n, r in reps.items())))  # type: ignore
    return None


def expand_workloads(declared: Sequence[Workload]
                     ) -> tuple[list[Workload], list[Workload], dict[Workload, Bucket]]:
    """(dynamic declarations, every workload to build and tune, bucket of each representative).

    A static workload stands for itself; a dynamic one for the representative of each of its
    buckets. Raises ValueError for a Dim name used with two ranges."""
    dynamic, concrete, of = [], [], {}
    for w in declared:
        if not dims_of(w):
            if w not in concrete:
                concrete.append(w)
            continue
        dynamic.append(w)
        for b in buckets(w):
            rep = b.representative
            if rep not in concrete:
                concrete.append(rep)
                of[rep] = b
    return dynamic, concrete, of
