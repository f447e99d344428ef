"""Why a call is not covered by its kernel's declarations, and the edit that would cover it.

`explain` compares a call (as specs: `serve.live_args.workload_spec`) with every declared
workload and names what no declaration has -- a dtype, a rank, a size, a size beyond a `Dim`'s
range, a ``ct.Constant``'s value, a layout (strides, base alignment) -- the nearest declared
workload, and the edit to ``workloads=[...]`` that would cover the call. Which calls a size
outside a `Dim`'s range makes a miss is `ctbuild.range_rule`'s, for the runtime and `explain`
alike.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .dims import Dim
from .specs import Scalar, Tensor, Workload, contiguous_strides

#: Gap kinds, most telling first (the order reasons are listed in).
KINDS = ("argument", "dtype", "rank", "constant", "scalar", "range", "size", "layout")


@dataclass(frozen=True)
class Gap:
    """One part of a call's key that a declared workload does not have."""
    kind: str       # one of KINDS
    arg: str        # the call argument
    text: str       # e.g. "X: dtype float16, declared float32"
    dim: Dim | None = None   # for "range": the Dim the size is outside of; for "size": the
    size: int = 0            # Dim the call gives two sizes. The call's size


def _scalar_type(value: Any) -> str:
    if isinstance(value, Scalar):
        return value.dtype
    if isinstance(value, bool):
        return "bool"
    return {int: "int32", float: "float32"}.get(type(value), type(value).__name__)


def _tensor_gaps(name: str, d: Tensor, v: Tensor, sizes: dict[str, int]) -> list[Gap]:
    """What the call's tensor ``v`` has that the declared ``d`` does not (a dtype and the
    sizes both: a fix covering only the dtype would leave a size beyond a Dim missed)."""
    gaps = []
    if v.dtype != d.dtype:
        gaps.append(Gap("dtype", name, f"{name}: dtype {v.dtype}, declared {d.dtype}"))
    if v.ndim != d.ndim:
        return gaps + [Gap("rank", name, f"{name}: rank {v.ndim} {v.shape}, declared rank "
                           f"{d.ndim}")]
    for i, (want, n) in enumerate(zip(d.shape, v.shape)):
        if isinstance(want, Dim):
            if not want.lo <= n <= want.hi:
                side = "above" if n > want.hi else "below"
                gaps.append(Gap("range", name, f"{name} dim {i}: size {n} is {side} the range "
                                f"[{want.lo}, {want.hi}] of {want!r}", want, n))
            elif sizes.setdefault(want.name, n) != n:
                gaps.append(Gap("size", name, f"{name} dim {i}: size {n}, but Dim "
                                f"{want.name!r} is {sizes[want.name]} in another argument",
                                want, n))
        elif want != n:
            gaps.append(Gap("size", name, f"{name} dim {i}: size {n}, declared {want}"))
    declared_strides = d.strides or contiguous_strides(v.shape)
    if v.strides is not None and tuple(v.strides) != tuple(declared_strides) and not (
            d.strides is None and v.is_contiguous()):
        gaps.append(Gap("layout", name, f"{name}: strides {v.strides}, declared "
                        f"{'contiguous' if d.strides is None else d.strides}"))
    if v.align % 16 and not d.align % 16:
        gaps.append(Gap("layout", name, f"{name}: base address aligned to {v.align} bytes, "
                        f"declared {d.align}"))
    return gaps


def gaps(declared: Mapping[str, Any], call: Mapping[str, Any], constants: frozenset[str]
         ) -> list[Gap]:
    """Every part of ``call`` (specs) that ``declared`` does not have, most telling first."""
    found: list[Gap] = []
    sizes: dict[str, int] = {}
    for name, d in declared.items():
        if name not in call:
            found.append(Gap("argument", name, f"{name}: not passed"))
            continue
        v = call[name]
        if isinstance(d, Tensor):
            if not isinstance(v, Tensor):
                found.append(Gap("argument", name, f"{name}: {v!r}, declared a tensor"))
            else:
                found += _tensor_gaps(name, d, v, sizes)
        elif name in constants:
            if v != d or type(v) is not type(d):
                found.append(Gap("constant", name, f"{name}: ct.Constant value {v!r}, "
                                 f"declared {d!r}"))
        elif _scalar_type(v) != _scalar_type(d):
            found.append(Gap("scalar", name, f"{name}: {_scalar_type(v)}, declared "
                             f"{_scalar_type(d)}"))
    return sorted(found, key=lambda g: KINDS.index(g.kind))


def nearest(declared: Sequence[Workload], call: Mapping[str, Any], constants: frozenset[str]
            ) -> tuple[Workload, list[Gap]] | None:
    """The declared workload with the fewest gaps to the call (the first of equals)."""
    best: tuple[Workload, list[Gap]] | None = None
    for w in declared:
        found = gaps(w, call, constants)
        if best is None or len(found) < len(best[1]):
            best = (w, found)
    return best


def dim_names(module: str) -> dict[Dim, str]:
    """The module-level names of the `Dim` s a module declares (``ROWS = Dim(...)``): a fix
    pasted into that module names them, as its own workloads do."""
    found = getattr(sys.modules.get(module), "__dict__", {})
    return {v: k for k, v in found.items() if isinstance(v, Dim) and not k.startswith("_")}


def _source(value: Any, names: Mapping[Dim, str]) -> str:
    """Python source for one declared argument (what a user pastes into workloads=[...]): a
    `Dim` by its module-level name, else in full with its buckets, so the pasted workload
    tunes the declaration's buckets."""
    if isinstance(value, Tensor):
        extra = "" if value.strides is None or value.strides == contiguous_strides(value.shape) \
            else f", strides={value.strides}"
        extra += "" if value.align == 256 else f", align={value.align}"
        sizes = [names.get(d) or d.source() if isinstance(d, Dim) else repr(d)
                 for d in value.shape]
        shape = "(" + ", ".join(sizes) + (",)" if value.ndim == 1 else ")")
        return f"Tensor({shape}, {value.dtype!r}{extra})"
    return repr(value)


def _fixed_dims(declared: Workload, found: list[Gap]) -> set[str]:
    """The Dims a covering workload cannot keep: those of a tensor that must be declared as
    the call's very view (a rank, a non-tensor or strides no `Dim` tensor has), and those the
    call gives two sizes. Their sizes become the call's, in every tensor."""
    fixed = {g.dim.name for g in found if g.kind == "size" and g.dim is not None}
    concrete = {g.arg for g in found if g.kind in ("rank", "argument")
                or (g.kind == "layout" and "strides" in g.text)}
    for name in concrete:
        value = declared[name]
        if isinstance(value, Tensor):
            fixed |= {d.name for d in value.shape if isinstance(d, Dim)}
    return fixed


def _covering_tensor(d: Tensor, v: Tensor, fixed: set[str], widened: dict[str, Dim],
                     kinds: set[str]) -> Tensor:
    """The declared tensor changed as little as covers the call's: its Dims kept (widened
    where the call's size is outside them; the call's size where `_fixed_dims` says), its
    other sizes, dtype and alignment the call's."""
    shape: tuple[Any, ...] = tuple(  # sizes and Dims (a `Tensor` shape holds both)
        (widened.get(want.name, want) if want.name not in fixed else n)
        if isinstance(want, Dim) else n for want, n in zip(d.shape, v.shape))
    align = v.align if "layout" in kinds else d.align
    if any(isinstance(n, Dim) for n in shape):
        return Tensor(shape, v.dtype, None, align)
    return Tensor(shape, v.dtype, d.strides if not kinds else v.strides, align)


def covering_workload(declared: Workload, call: Mapping[str, Any], found: list[Gap]
                      ) -> dict[str, Any]:
    """The workload to add so that the call is covered: ``declared`` with only what the call
    differs in changed, its Dims and their buckets kept, so pasting it adds the buckets of one
    declaration (not one per size of a Dim that lost its buckets or its tensors)."""
    kinds: dict[str, set[str]] = {}
    for g in found:
        kinds.setdefault(g.arg, set()).add(g.kind)
    fixed = _fixed_dims(declared, found)
    widened = {g.dim.name: g.dim.widened(g.size) for g in found
               if g.kind == "range" and g.dim is not None}
    out: dict[str, Any] = {}
    for name, d in declared.items():
        v = call.get(name, d)
        if isinstance(d, Tensor) and isinstance(v, Tensor) and d.ndim == v.ndim:
            out[name] = _covering_tensor(d, v, fixed, widened, kinds.get(name, set()))
        else:
            out[name] = v if name in kinds else d
    return out


def covering_edit(declared: Workload, call: Mapping[str, Any], found: list[Gap],
                  names: Mapping[Dim, str] | None = None) -> str:
    """The edit to ``workloads=[...]`` that covers the call: widen a Dim, or add a workload
    (its Dims by their ``names`` in the declaring module, `dim_names`)."""
    names = names or {}
    if found and all(g.kind == "range" for g in found):
        widened = {}
        for g in found:
            assert g.dim is not None
            widened[g.dim] = g.dim.widened(g.size).source()
        return "; ".join(f"widen {names.get(d) or d.source()} to {new} in workloads=[...]"
                         for d, new in widened.items())
    suggested = covering_workload(declared, call, found)
    text = "{" + ", ".join(f"{name!r}: {_source(v, names)}"
                           for name, v in suggested.items()) + "}"
    return f"add {text} to workloads=[...]"


def explain_gaps(declared: Sequence[Workload], call: Mapping[str, Any],
                 constants: frozenset[str], *, cubin_miss: bool, arch: str,
                 cache_problem: tuple[str, str] | None = None,
                 names: Mapping[Dim, str] | None = None) -> dict[str, Any]:
    """``why``, ``nearest`` and ``fix`` for `explain`: what no declaration has, the nearest
    declared workload, and the edit (or, for a declared call, the command) that covers it.
    ``cache_problem`` (a cache that can serve nothing, and what to do) comes first, and is
    the fix of a declared call; ``names``: `dim_names` of the declaring module."""
    out = _gaps_and_edit(declared, call, constants, cubin_miss=cubin_miss, arch=arch,
                         names=names or {})
    if cache_problem is not None:
        out["why"].insert(0, cache_problem[0])
        if out["why"][1:2] == ["declared, but no CUBIN for it is in this cache"]:
            out["fix"] = cache_problem[1]
    return out


def _gaps_and_edit(declared: Sequence[Workload], call: Mapping[str, Any],
                   constants: frozenset[str], *, cubin_miss: bool, arch: str,
                   names: Mapping[Dim, str]) -> dict[str, Any]:
    found = nearest(declared, call, constants)
    if found is None:
        return {"why": ["the kernel declares no workloads"], "nearest": None,
                "fix": "declare the workloads it will see in workloads=[...]"}
    w, missing = found
    if not missing:
        what, fix = (("declared, but no CUBIN for it is in this cache",
                      f"ctbuild precompile --config ctbuild.toml --arch {arch} into this cache")
                     if cubin_miss else
                     ("declared, but not tuned on this GPU (no tuning record)",
                      "ctbuild tune --config ctbuild.toml on this GPU, into this cache"))
        return {"why": [what], "nearest": repr(w), "fix": fix}
    return {"why": [g.text for g in missing], "nearest": repr(w),
            "fix": covering_edit(w, call, missing, names)}
