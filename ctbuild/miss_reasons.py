"""Why a call is not covered by its kernel's declarations, and the edit that would cover it.

`explain` compares a call (as specs: `serve.live_args.workload_spec`) with every declared
workload and names what no declaration has -- a dtype, a rank, a size, a size beyond a `Dim`'s
range, a ``ct.Constant``'s value, a layout (strides, base alignment) -- the nearest declared
workload, and the edit to ``workloads=[...]`` that would cover the call. `beyond_range` tells
the runtime when a call fits a dynamic declaration except for a size outside a `Dim`'s range:
no build planned, compiled or tuned that size, so it is a miss (strict mode raises), never a
silent default config.
"""
from __future__ import annotations

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
    dim: Dim | None = None   # for "range": the Dim the size is outside of
    size: int = 0            # for "range": the call's size


def _scalar_type(value: Any) -> str:
    if isinstance(value, Scalar):
        return value.dtype
    if isinstance(value, bool):
        return "bool"
    return {int: "int32", float: "float32"}.get(type(value), type(value).__name__)


def _tensor_gaps(name: str, d: Tensor, v: Tensor, sizes: dict[str, int]) -> list[Gap]:
    """What the call's tensor ``v`` has that the declared ``d`` does not."""
    if v.dtype != d.dtype:
        return [Gap("dtype", name, f"{name}: dtype {v.dtype}, declared {d.dtype}")]
    if v.ndim != d.ndim:
        return [Gap("rank", name, f"{name}: rank {v.ndim} {v.shape}, declared rank {d.ndim}")]
    gaps = []
    for i, (want, n) in enumerate(zip(d.shape, v.shape)):
        if isinstance(want, Dim):
            if not want.lo <= n <= want.hi:
                side = "above" if n > want.hi else "below"
                gaps.append(Gap("range", name, f"{name} dim {i}: size {n} is {side} the range "
                                f"[{want.lo}, {want.hi}] of {want!r}", want, n))
            elif sizes.setdefault(want.name, n) != n:
                gaps.append(Gap("size", name, f"{name} dim {i}: size {n}, but Dim "
                                f"{want.name!r} is {sizes[want.name]} in another argument"))
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


def beyond_range(dynamic: Sequence[Workload], call: Mapping[str, Any],
                 constants: frozenset[str]) -> str | None:
    """When the call fits a dynamic declaration except for sizes outside its `Dim` ranges,
    what is outside (one phrase); else None."""
    for w in dynamic:
        found = gaps(w, call, constants)
        if found and all(g.kind == "range" for g in found):
            return "; ".join(g.text for g in found)
    return None


def _source(value: Any) -> str:
    """Python source for one declared argument (what a user pastes into workloads=[...])."""
    if isinstance(value, Tensor):
        extra = "" if value.strides is None or value.strides == contiguous_strides(value.shape) \
            else f", strides={value.strides}"
        extra += "" if value.align == 256 else f", align={value.align}"
        shape = "(" + ", ".join(map(repr, value.shape)) + (",)" if value.ndim == 1 else ")")
        return f"Tensor({shape}, {value.dtype!r}{extra})"
    return repr(value)


def _covering(declared: Any, value: Any, kinds: set[str]) -> Any:
    """The declared argument changed to cover the call's: only the dtype where only that
    differs (a Dim stays a Dim), else the call's own spec."""
    if kinds == {"dtype"} and isinstance(declared, Tensor) and isinstance(value, Tensor):
        return Tensor(declared.shape, value.dtype, declared.strides, declared.align)
    return value


def covering_edit(declared: Workload, call: Mapping[str, Any], found: list[Gap]) -> str:
    """The edit to ``workloads=[...]`` that covers the call: widen a Dim, or add a workload."""
    if found and all(g.kind == "range" for g in found):
        widened = {}
        for g in found:
            assert g.dim is not None
            lo, hi = min(g.dim.lo, g.size), max(g.dim.hi, g.size)
            widened[g.dim] = f"Dim({g.dim.name!r}, {lo}, {hi})"
        return "; ".join(f"widen {d!r} to {new} in workloads=[...]" for d, new in widened.items())
    kinds: dict[str, set[str]] = {}
    for g in found:
        kinds.setdefault(g.arg, set()).add(g.kind)
    suggested = {name: _covering(value, call[name], kinds[name]) if name in kinds else value
                 for name, value in declared.items()}
    text = "{" + ", ".join(f"{name!r}: {_source(v)}" for name, v in suggested.items()) + "}"
    return f"add {text} to workloads=[...]"


def explain_gaps(declared: Sequence[Workload], call: Mapping[str, Any],
                 constants: frozenset[str], *, cubin_miss: bool, arch: str,
                 cache_problem: str | None = None) -> dict[str, Any]:
    """``why``, ``nearest`` and ``fix`` for `explain`: what no declaration has, the nearest
    declared workload, and the edit (or, for a declared call, the command) that covers it.
    ``cache_problem`` (a cache that can serve nothing) comes first, with its own fix."""
    out = _gaps_and_edit(declared, call, constants, cubin_miss=cubin_miss, arch=arch)
    if cache_problem is not None:
        out["why"].insert(0, cache_problem)
        if out["why"][1:2] == ["declared, but no CUBIN for it is in this cache"]:
            out["fix"] = ("point CTBUILD_CACHE_DIR (or cache_dir in ctbuild.toml) at the cache "
                          "`ctbuild precompile` built")
    return out


def _gaps_and_edit(declared: Sequence[Workload], call: Mapping[str, Any],
                   constants: frozenset[str], *, cubin_miss: bool, arch: str
                   ) -> dict[str, Any]:
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
            "fix": covering_edit(w, call, missing)}
