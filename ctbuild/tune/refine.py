"""``ctbuild tune --refine``: split a `Dim` bucket where its winner's regret exceeds the tie
band, and tune each sub-bucket at its split point.

A bucket's regret (`ctbuild.tune.regret`) is timed at its lower bound and geometric midpoints.
Every such size where the bucket's winner is more than the tie band slower than the fastest
contender becomes a split point: the sizes up to it form a sub-bucket, tuned at the point (so
the size that showed the regret gets its own winner) and recorded under the point's tuning key.
At most ``--refine N`` points per bucket are kept, the worst regrets first; the others are
named as left out. The points whose sub-bucket got a record are written into the bucket's own
record (`ctbuild.bucket_map`), which is where the runtime reads them. Running ``--refine``
again re-derives the points from the recorded regret, keeps the sub-buckets already tuned and
tunes the others (e.g. once ``--compile-missing`` supplies their CUBINs).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping

from ..bucket_map import MAX_SPLITS, BucketMapError, Split, read_splits, refined_json
from ..dims import Bucket
from ..records import TuningRecord, stored_tuning
from .choice import TieBand
from .tuner import Device, TuneSettings, record_key, tune_workload

if TYPE_CHECKING:
    from ctbuild.cache import Store

    from ..compile.compile_pool import CompilePool
    from ..declare import TunedKernel
    from .session import Entry, TuneOptions


def split_points(record: TuningRecord, bucket: Bucket, band: TieBand, limit: int
                 ) -> tuple[list[Split], list[dict[str, Any]]]:
    """(the split points of a bucket, smallest first; the interior sizes above the band left out
    by ``limit``), from the record's regret. The record may come from a shared cache: sizes
    that are not whole numbers inside the bucket, or regrets that are not numbers, are ignored."""
    regret = record.regret if isinstance(record.regret, dict) else {}
    sizes = regret.get("sizes")
    over: list[Split] = []
    for s in sizes[:MAX_SPLITS * 4] if isinstance(sizes, list) else ():
        pct = s.get("regret_pct") if isinstance(s, dict) else None
        if not isinstance(pct, (int, float)) or isinstance(pct, bool) or pct <= band.percent:
            continue
        try:
            over += read_splits({"splits": [{"sizes": s.get("sizes"), "regret_pct": pct}]}, bucket)
        except BucketMapError:
            continue
    over.sort(key=lambda sp: -(sp.regret_pct or 0.0))
    kept = sorted(over[:limit], key=lambda sp: sp.point)
    try:
        read_splits(refined_json(kept, limit), bucket)
    except BucketMapError:  # not nested (a hostile regret entry): keep the worst one only
        kept = [max(kept, key=lambda sp: sp.regret_pct or 0.0)]
    return kept, [sp.to_json() for sp in over[limit:]]


def refine_bucket(entry: Entry, summary: dict[str, Any], store: Store, opts: TuneOptions, *,
                  device: Device, fp: str, pool: CompilePool | None,
                  exclude: Mapping[str, str] | None = None,
                  on_candidate: Callable[[Any], None] | None = None,
                  **workload_kwargs: Any) -> dict[str, Any]:
    """Refine one entry's bucket after it was tuned (or found tuned): tune its sub-buckets and
    record the map in its record. Returns the summary with ``refined`` (per split point its
    outcome, the points left out) and the record as rewritten. ``workload_kwargs`` go to
    `tune_workload` (where to launch and allocate)."""
    bucket = entry.kernel.buckets.get(entry.workload)
    if bucket is None or summary.get("record") is None or summary.get("winner") is None:
        return summary
    record = TuningRecord.from_json(summary["record"])
    band = TieBand(opts.tie_band)
    points, left_out = split_points(record, bucket, band, opts.refine)
    outcomes = [tune_split(entry.kernel, bucket, sp, store, opts, device=device, fp=fp,
                           pool=pool, exclude=exclude, on_candidate=on_candidate,
                           below=points[i - 1] if i else None, **workload_kwargs)
                for i, sp in enumerate(points)]
    done = [sp for sp, out in zip(points, outcomes) if out["status"] in ("tuned", "kept")]
    if record.refined != (refined := refined_json(done, opts.refine)):
        record.refined = refined
        store.put_tuning(summary["record_key"], record.to_json())
    return {**summary, "record": record.to_json(),
            "refined": {"band_pct": band.percent, "max_splits": opts.refine,
                        "max_regret_pct": (record.regret or {}).get("max_pct")
                        if isinstance(record.regret, dict) else None,
                        "splits": outcomes, "left_out": left_out}}


def keep_refined(store: Store, key: str, record: TuningRecord, before: TuningRecord | None
                 ) -> None:
    """A bucket retuned without ``--refine`` keeps the split points its record had: each
    sub-bucket has a record of its own, tuned at its split point; the next ``--refine``
    derives the points anew from the fresh regret."""
    if before is None or before.refined is None or record.config is None:
        return
    record.refined = before.refined
    store.put_tuning(key, record.to_json())


def tune_split(kernel: TunedKernel, bucket: Bucket, split: Split, store: Store,
               opts: TuneOptions, *, device: Device, fp: str, pool: CompilePool | None,
               exclude: Mapping[str, str] | None = None,
               on_candidate: Callable[[Any], None] | None = None,
               below: Split | None = None, **workload_kwargs: Any) -> dict[str, Any]:
    """Tune one sub-bucket at its split point (kept when already tuned, unless ``--retune``),
    with the regret of its winner timed inside it (from the split ``below`` it, or the
    bucket's lower bound, up to the point): its outcome, with what was missing."""
    sub = split.sub_bucket(bucket, below)
    spec = sub.representative
    key = record_key(kernel, spec, device, fp)
    out: dict[str, Any] = {"sizes": split.sizes, "regret_pct": split.regret_pct,
                           "record_key": key}
    declared = {repr(kernel.tuning_key(w)) for w in kernel.workloads}
    if repr(kernel.tuning_key(spec)) in declared:
        return {**out, "status": "failed", "note": (
            "the kernel's tuning key gives this size the key of a declared workload: a split "
            "needs a key function that tells the sizes apart (e.g. no pow2 bucketing of this "
            "dim)")}
    existing = None if opts.retune else stored_tuning(store, key)
    if existing is not None and existing.config is not None:
        return {**out, "status": "kept", "winner": existing.config, "mean_us": existing.mean_us,
                "note": "sub-bucket already tuned (use --retune)"}
    rec = tune_workload(kernel, spec, store=store, toolchain_fp=fp, device=device, cap=opts.cap,
                        timeout_s=opts.timeout_s, exclude=exclude, pool=pool,
                        on_candidate=on_candidate,
                        settings=TuneSettings(band=TieBand(opts.tie_band)), bucket=sub,
                        **workload_kwargs)
    missing = sum(str(f.get("error", "")).startswith("missing") for f in rec.failures)
    hint = f"{missing} candidate(s) have no CUBIN: pass --compile-missing or run ctbuild " \
        "precompile" if missing else ""
    if rec.config is None:
        return {**out, "status": "failed", "missing": missing,
                "note": "no candidate could be measured" + (f"; {hint}" if hint else "")}
    return {**out, "status": "tuned", "winner": rec.config, "mean_us": rec.mean_us,
            "ci_us": rec.ci_us, "missing": missing, "note": hint,
            "compiled_during_tune": rec.compiled_during_tune}
