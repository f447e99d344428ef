"""Workloads the cache holds CUBINs for but no declaration names: those ``ctbuild precompile
--from-record`` added from calls recorded at run time. ``ctbuild tune`` tunes them too, so the
miss loop (record -> precompile --from-record -> tune -> warm) closes without editing the
declaration."""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Sequence

from ..records import CompileMeta, RecordFormatError
from ..specs import Workload, spec_from_json

if TYPE_CHECKING:
    from ctbuild.cache import Store

    from ..declare import TunedKernel


def recorded_workloads(store: Store, kernels: Sequence[TunedKernel], arch: str
                       ) -> dict[str, list[Workload]]:
    """Per kernel name, the workloads of exact-class compile entries of this kernel source and
    arch whose tuning key no declared workload has (sorted, so every process agrees)."""
    by_name = {k.name: k for k in kernels}
    found: dict[str, dict[str, Workload]] = {}
    for _, stored in store.compile_entries():
        try:
            meta = CompileMeta.from_json(stored)
        except RecordFormatError:
            continue
        kernel = by_name.get(meta.kernel)
        if kernel is None or meta.kernel_fp != kernel.fingerprint or \
                meta.arch != arch or meta.signature_class != "exact" or \
                not isinstance(meta.workload, dict):
            continue
        try:
            w = Workload({p: spec_from_json(meta.workload[p]) for p in kernel.params})
        except (KeyError, TypeError, ValueError):
            continue
        text = json.dumps(meta.workload, sort_keys=True)
        found.setdefault(kernel.name, {})[text] = w
    out: dict[str, list[Workload]] = {}
    for name, ws in found.items():
        kernel = by_name[name]
        declared = {json.dumps(kernel.tuning_key(w), sort_keys=True) for w in kernel.workloads}
        extra = [ws[t] for t in sorted(ws)
                 if json.dumps(kernel.tuning_key(ws[t]), sort_keys=True) not in declared]
        if extra:
            out[name] = extra
    return out
