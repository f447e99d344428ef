"""What a plan covers at serve time, per kernel: dynamic dims, buckets (and the sub-buckets
``ctbuild tune --refine`` recorded in the cache), CUBIN classes, and the ``ct.Constant``
parameters that no class can cover (derived from a dynamic dim)."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..bucket_map import BucketMapError, describe_bucket, read_splits
from ..dims import concretize, dims_of
from ..records import RecordFormatError, TuningRecord
from ..signature_classes import CLASSES
from ..specs import Workload, spec_from_json

if TYPE_CHECKING:
    from ..declare import TunedKernel
    from .plan import Plan

log = logging.getLogger("ctbuild")


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


def refined_buckets(cache_dir: Path | None, kernels: list[TunedKernel]
                    ) -> dict[str, list[dict[str, Any]]]:
    """Per kernel name, the buckets of its current version that ``ctbuild tune --refine`` split
    in the cache at ``cache_dir`` (read-only; nothing when there is no cache): the bucket, its
    split points and the GPU they were measured on. Unusable entries are skipped with a
    warning, as the runtime skips them."""
    if cache_dir is None or not Path(cache_dir).is_dir():
        return {}
    from ctbuild.cache import Store
    by_fp = {(k.name, k.fingerprint): k for k in kernels}
    out: dict[str, list[dict[str, Any]]] = {}
    try:
        store = Store(cache_dir, readonly=True)
    except Exception as exc:  # noqa: BLE001 - listing never fails the plan
        log.warning("ctbuild: %s: refined buckets not shown (%s)", cache_dir, exc)
        return {}
    with store:
        for key, raw in store.tuning_records():
            try:
                rec = TuningRecord.from_json(raw)
                kernel = by_fp.get((rec.kernel, rec.kernel_fp))
                if kernel is None or rec.refined is None:
                    continue
                w = Workload({p: spec_from_json(rec.workload[p]) for p in kernel.params})
                bucket = kernel.buckets.get(w)
                splits = read_splits(rec.refined, bucket) if bucket is not None else ()
            except (RecordFormatError, BucketMapError, KeyError, TypeError, ValueError) as exc:
                log.warning("ctbuild: tuning record %s: refined buckets not shown (%s)", key, exc)
                continue
            if bucket is not None and splits:
                out.setdefault(rec.kernel, []).append({
                    "bucket": bucket.to_json(), "splits": [sp.to_json() for sp in splits],
                    "gpu": rec.gpu, "arch": rec.arch, "toolchain": rec.toolchain})
    return out


def refined_lines(refined: dict[str, list[dict[str, Any]]]) -> list[str]:
    """``ctbuild plan``'s lines for the refined buckets found in the cache."""
    return [f"{name:<16} bucket {describe_bucket(r['bucket'])} split at "
            f"{'; '.join(describe_bucket(s['sizes']) for s in r['splits'])} ({r['gpu']}, "
            f"{r['arch']})" for name, rs in sorted(refined.items()) for r in rs]
