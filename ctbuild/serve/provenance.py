"""Where a kernel's launches came from (`TunedKernel.runtime.provenance()`): per resolved call
layout, its config's origin and the signature class of its CUBIN, with launch counts."""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .entry import Entry
    from .resolve import Resolved

#: Where a launch's config came from -> the provenance label (unless its CUBIN was JIT-compiled).
#: ``fallback``: the winner had no CUBIN covering the call, the default config's generic one did.
ORIGIN_OF_CONFIG = {"cache": "cache", "memory": "cache", "default": "default",
                    "disabled": "default", "online": "tuned", "fallback": "default"}
ORIGINS = ("cache", "default", "tuned", "jit")
#: What served a launch's CUBIN: a signature class of the cache, or a compile (``miss``).
CUBIN_CLASSES = ("exact", "relaxed", "generic", "miss")


def describe(res: Resolved, cubin_from: str, cubin_class: str) -> dict[str, Any]:
    """What resolved one call layout, and what served its first launch."""
    return {"tuning_key": res.tuning_key, "arch": res.arch, "gpu": res.gpu,
            "device": res.device, "config": res.config.to_json(),
            "config_from": res.config_from, "cubin_from": cubin_from,
            "cubin_class": cubin_class, "bucket": res.bucket, "sub_bucket": res.sub_bucket,
            "compile_key": res.compile_key,
            "workload": res.workload_json, "created": time.time()}


def _origin(info: dict[str, Any]) -> str:
    return "jit" if info["cubin_from"] == "jit" else ORIGIN_OF_CONFIG.get(
        info["config_from"], info["config_from"])


def totals(entries: Iterable[Entry]) -> Counter:
    """Launches by ``("origin", label)`` and ``("class", class)`` (what `summary` counts): the
    runtime folds entries it drops into these, so counts stay whole while rows stay bounded."""
    out: Counter = Counter()
    for e in entries:
        n = e.launches()
        out["origin", _origin(e.info)] += n
        out["class", e.info["cubin_class"]] += n
    return out


def summary(kernel: str, mode: str, entries: Iterable[Entry], misses: dict[str, int],
            served_kernels: int, keys: str, retired: Counter | None = None) -> dict[str, Any]:
    """Counts by origin and by CUBIN class, and one row per resolved call layout still held
    (``retired``: the `totals` of rows dropped, and their number under ``("rows",
    "dropped")``). ``keys``: what the hot path's keys hold per
    tensor, one of `declaration_reads.KEY_LEVELS`."""
    entries, retired = list(entries), retired or Counter()
    counts = totals(entries) + retired
    origins = {o: counts["origin", o] for o in ORIGINS}
    classes = {c: counts["class", c] for c in CUBIN_CLASSES}
    rows = [{"origin": _origin(e.info), "launches": e.launches(), **e.info} for e in entries]
    return {"kernel": kernel, "mode": mode, "launches": sum(origins.values()),
            "origins": origins, "classes": classes, "misses": misses,
            "served_kernels": served_kernels, "keys": keys, "entries": rows,
            "dropped_rows": retired["rows", "dropped"]}
