"""What a plan covers at serve time, per kernel: dynamic dims, buckets, CUBIN classes, and the
``ct.Constant`` parameters that no class can cover (derived from a dynamic dim)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..dims import concretize, dims_of
from ..signature_classes import CLASSES

if TYPE_CHECKING:
    from ..declare import TunedKernel
    from .plan import Plan


def derived_constants(kernel: TunedKernel) -> list[dict[str, Any]]:
    """``ct.Constant`` parameters whose value changes with a dynamic dim (default config):
    every value is its own CUBIN, so sizes between the buckets' representatives miss."""
    found = []
    for w in kernel.dynamic_workloads:
        dims = dims_of(w)
        sizes_list = [{n: d.lo for n, d in dims.items()}, {n: d.hi for n, d in dims.items()}]
        sizes_list += [{n: b for n in dims} for d in dims.values() for b in d.buckets or ()]
        params = kernel.kernel_params
        seen: dict[str, set] = {}
        for sizes in sizes_list:
            try:
                rep = concretize(w, sizes)
                args = kernel.kernel_args(kernel.default_config(rep), rep)
            except Exception:  # noqa: BLE001 - judged where the plan computes the same call
                continue
            for p, v in zip(params, args):
                if p in kernel._constant_params:
                    seen.setdefault(p, set()).add(repr(v))
        for p, values in seen.items():
            if len(values) > 1:
                found.append({
                    "parameter": p, "dims": sorted(dims), "values": sorted(values)[:8],
                    "message": (
                        f"kernel {kernel.name!r}: ct.Constant parameter {p!r} changes with "
                        f"dynamic dim(s) {', '.join(sorted(dims))} (values "
                        f"{', '.join(sorted(values)[:4])}...): no CUBIN class covers a constant, "
                        "so sizes other than the buckets' representatives miss. Declare the "
                        "values it takes instead: a static workload per value, or Dim buckets= "
                        "at exactly the sizes that give them; or pass it as a runtime "
                        "argument")})
    return found


def kernel_coverage(plan: Plan, kernel: TunedKernel) -> dict[str, Any]:
    """The ``coverage`` object of one kernel in ``ctbuild plan --json``."""
    entries = [e for e in plan.entries if e.kernel is kernel]
    dims: dict[str, Any] = {}
    for w in kernel.dynamic_workloads:
        for name, d in dims_of(w).items():
            dims[name] = d.to_json()
    keys_by_class = {c: sorted({k for e in entries for k in e.class_keys.get(c, [])})
                     for c in CLASSES}
    claimed: set[str] = set()
    classes = {}
    for c in CLASSES:  # a key planned in two classes counts once, in the most specialised
        mine = [k for k in keys_by_class[c] if k not in claimed]
        claimed.update(mine)
        classes[c] = len(mine)
    return {
        "dynamic_dims": dims,
        "buckets": len({e.workload for e in entries if e.workload in kernel.buckets}),
        "static_workloads": len({e.workload for e in entries
                                 if e.workload not in kernel.buckets}),
        "classes": classes,
        "cubins": len(claimed),
        "generic": any(e.class_keys.get("generic") for e in entries),
        "uncoverable_constants": derived_constants(kernel),
    }


def summary_lines(plan: Plan, kernels: list[TunedKernel]) -> list[str]:
    """The readable coverage summary ``ctbuild plan`` prints, plus its warnings."""
    lines = []
    for k in kernels:
        cov = kernel_coverage(plan, k)
        dims = ", ".join(f"{n} in [{d['lo']}, {d['hi']}]" for n, d in cov["dynamic_dims"].items())
        classes = ", ".join(f"{n} {c}" for c, n in cov["classes"].items())
        lines.append(f"{k.name:<16} {dims or 'static shapes only':<28} "
                     f"{cov['buckets']:>3} buckets  {cov['cubins']:>4} CUBINs ({classes})")
        for warn in cov["uncoverable_constants"]:
            lines.append(f"warning: {warn['message']}")
    return lines
