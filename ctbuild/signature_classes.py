"""Signature classes: CUBINs compiled with weaker assumptions, serving many call layouts.

cuTile passes every array as pointer + shapes + strides whatever the signature assumes, so a
CUBIN compiled for a weaker signature correctly serves every call whose layout satisfies its
assumptions (measured on an H200: the fully generic CUBIN of a matmul served 17 of 17 layouts,
odd sizes, misaligned, strided, broadcast, transposed and size-1 dims included). Three classes:

- ``exact``: the call's own signature.
- ``relaxed``: shape divisibility and size-1 shape constants dropped on the dims declared
  dynamic (`ctbuild.Dim`), stride divisibility dropped on the strides that depend on them.
  Static dims keep theirs (dropping it on a static dim cost 2x on a row kernel). A size-1
  dynamic dim makes the dispatcher switch to calling convention v2 with shape constant 1;
  dropping that constant brings the relaxed signature back to v1, so the relaxed CUBIN serves
  size 1 too (arrays travel as pointer + shapes + strides in both conventions): no own class.
- ``generic``: no divisibility, alignment, unit-stride or shape constants anywhere, arrays may
  alias internally; dtypes, ranks, index types, scalars and constants kept. One per kernel,
  arch and dtype/constant pattern, of the default config: a safety net (up to 26x slower).

`weaken` is a pure function of (signature, class, dynamic positions): the plan derives the
CUBINs it precompiles with it and the runtime derives what to look up with it, so build and
serve agree bit for bit. Compile keys of weakened signatures come from
`keys.kernel_compile_key`, like every other compile key.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from cuda.tile.compilation import (
    ArrayConstraint,
    CallingConvention,
    KernelSignature,
    ListConstraint,
    TupleConstraint,
)

from .dims import DynamicPositions

if TYPE_CHECKING:
    from .declare import TunedKernel
    from .space import Config

EXACT, RELAXED, GENERIC = "exact", "relaxed", "generic"
#: Most specialised first: the order the runtime looks CUBINs up in.
CLASSES = (EXACT, RELAXED, GENERIC)

#: Per kernel parameter: (dynamic shape dims, dynamic stride dims), or None (nothing varies).
ParamDynamics = tuple[tuple[tuple[int, ...], tuple[int, ...]] | None, ...]


@dataclass(frozen=True)
class Weakening:
    """How a CUBIN's signature derives from a call's: the class and, for ``relaxed``, which
    dims of which kernel parameters vary. JSON-able (it travels in compile jobs)."""
    cls: str
    dynamics: ParamDynamics = ()

    def to_json(self) -> dict[str, Any]:
        return {"class": self.cls, "dynamics": [None if d is None else [list(d[0]), list(d[1])]
                                                for d in self.dynamics]}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any] | None) -> Weakening:
        if not obj:
            return EXACT_WEAKENING
        dyn = tuple(None if d is None else (tuple(d[0]), tuple(d[1]))
                    for d in obj.get("dynamics", ()))
        return cls(str(obj["class"]), dyn)


EXACT_WEAKENING = Weakening(EXACT)
GENERIC_WEAKENING = Weakening(GENERIC)


def param_dynamics(kernel_args: Sequence[Any], call: Mapping[str, Any],
                   positions: Mapping[str, DynamicPositions]) -> ParamDynamics:
    """Map the dynamic positions of call arguments onto kernel parameters (an argument passed
    through ``args=`` is found by identity)."""
    out: list[Any] = []
    for value in kernel_args:
        name = next((n for n, v in call.items() if v is value), None)
        pos = positions.get(name) if name is not None else None
        out.append(None if pos is None else (pos.shape, pos.stride))
    return tuple(out)


def _weaken_array(c: ArrayConstraint, cls: str, dyn: Any) -> ArrayConstraint:
    n = c.ndim
    if cls == GENERIC:
        return ArrayConstraint(c.dtype, n, index_dtype=c.index_dtype, stride_lower_bound_incl=0,
                               alias_groups=c.alias_groups, may_alias_internally=True,
                               stride_constant=None, shape_constant=None, stride_divisible_by=1,
                               shape_divisible_by=1, base_addr_divisible_by=1)
    shape_dims, stride_dims = dyn if dyn is not None else ((), ())
    shape_const = list(c.shape_constant or (None,) * n)
    shape_div = list(c.shape_divisible_by)
    stride_div = list(c.stride_divisible_by)
    for i in shape_dims:
        if 0 <= i < n:
            shape_const[i] = None
            shape_div[i] = 1
    for i in stride_dims:
        if 0 <= i < n and c.stride_constant[i] is None:
            stride_div[i] = 1
    return ArrayConstraint(
        c.dtype, n, index_dtype=c.index_dtype, stride_lower_bound_incl=c.stride_lower_bound_incl,
        alias_groups=c.alias_groups, may_alias_internally=c.may_alias_internally,
        stride_constant=c.stride_constant, shape_constant=shape_const,
        stride_divisible_by=stride_div, shape_divisible_by=shape_div,
        base_addr_divisible_by=c.base_addr_divisible_by)


def _weaken(c: Any, cls: str, dyn: Any) -> Any:
    if isinstance(c, ArrayConstraint):
        return _weaken_array(c, cls, dyn)
    if isinstance(c, ListConstraint):
        return ListConstraint(_weaken_array(c.element, cls, dyn), alias_groups=c.alias_groups,
                              elements_may_alias=c.elements_may_alias)
    if isinstance(c, TupleConstraint):
        return TupleConstraint([_weaken(x, cls, None) for x in c.items])
    return c


def _needs_v2(c: Any) -> bool:
    if isinstance(c, TupleConstraint):
        return True
    if isinstance(c, ListConstraint):
        c = c.element
    if isinstance(c, ArrayConstraint):
        return any(x is not None for x in (c.shape_constant or ()))
    return False


def _as_v1(c: Any) -> Any:
    """The same constraint without shape constants (v1 has none; none are left)."""
    if isinstance(c, ArrayConstraint):
        return ArrayConstraint(
            c.dtype, c.ndim, index_dtype=c.index_dtype,
            stride_lower_bound_incl=c.stride_lower_bound_incl, alias_groups=c.alias_groups,
            may_alias_internally=c.may_alias_internally, stride_constant=c.stride_constant,
            shape_constant=None, stride_divisible_by=c.stride_divisible_by,
            shape_divisible_by=c.shape_divisible_by,
            base_addr_divisible_by=c.base_addr_divisible_by)
    if isinstance(c, ListConstraint):
        return ListConstraint(_as_v1(c.element), alias_groups=c.alias_groups,
                              elements_may_alias=c.elements_may_alias)
    return c


def weakened(signature: KernelSignature, weakening: Weakening) -> KernelSignature:
    """The signature of the CUBIN of class ``weakening.cls`` that serves ``signature``, with no
    symbol: what its compile key spells (mangling costs ~0.1-1 ms, and a key never needs it).

    Pure and deterministic: the calling convention is v2 only if something still needs it
    (a tuple, or a shape constant left on a static dim), else v1.
    """
    if weakening.cls == EXACT:
        return signature.with_symbol(None)
    if weakening.cls not in CLASSES:
        raise ValueError(f"unknown signature class {weakening.cls!r}")
    dyn = weakening.dynamics or (None,) * len(signature.parameters)
    params = [_weaken(c, weakening.cls, d) for c, d in zip(signature.parameters, dyn)]
    if any(_needs_v2(c) for c in params):
        cconv = CallingConvention.cutile_python_v2()
    else:
        cconv = CallingConvention.cutile_python_v1()
        params = [_as_v1(c) for c in params]
    return KernelSignature(params, cconv)


def weaken(signature: KernelSignature, weakening: Weakening, function_name: str
           ) -> KernelSignature:
    """`weakened`, with the symbol its CUBIN's kernel has (mangled from ``function_name``,
    as the runtime names it: `cutile.mangled_symbol`, without cuTile's check that the name
    demangles back, which was 85% of the mangling and most of a plan's time)."""
    from .cutile import mangled_symbol
    weak = weakened(signature, weakening)
    return weak.with_symbol(mangled_symbol(weak, function_name))


def lattice(patterns: Sequence[ParamDynamics]) -> list[Weakening]:
    """The weakenings to try for a call, most specialised first: exact, relaxed under each
    declared dynamic pattern (in declaration order, duplicates dropped), then generic."""
    out = [EXACT_WEAKENING]
    for p in patterns:
        w = Weakening(RELAXED, p)
        if w not in out:
            out.append(w)
    out.append(GENERIC_WEAKENING)
    return out


def dynamic_patterns(tuned: TunedKernel, cfg: Config) -> list[ParamDynamics]:
    """The relaxed patterns of a kernel's config: one per declared dynamic workload (computed
    on its first bucket; memoised on the kernel, since the runtime asks on every CUBIN miss)."""
    memo = tuned.__dict__.setdefault("_dynamic_patterns", {})
    found = memo.get(cfg)
    if found is None:
        from .dims import dynamic_positions
        found = []
        firsts: dict[int, Any] = {}
        for rep, bucket in tuned.buckets.items():
            firsts.setdefault(id(bucket.declared), (rep, bucket.declared))
        for rep, declared in firsts.values():
            try:
                p = param_dynamics(tuned.kernel_args(cfg, rep), rep, dynamic_positions(declared))
            except Exception:  # noqa: BLE001 - a config the declaration cannot apply here
                continue
            if p not in found:
                found.append(p)
        memo[cfg] = found
    return found
