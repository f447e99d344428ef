"""How good each `Dim` bucket's winner is at the sizes the bucket serves.

    python benchmarks/bucket_regret.py --cache DIR [--threshold 3] [--json FILE]
    python benchmarks/bucket_regret.py --cache DIR --measure --config C [--config C ...]

``--measure`` (on a GPU) does not trust the records: at sizes drawn log-uniformly inside each
bucket (seeded: the same sizes every run, whatever the tuner races; 4 a bucket over one Dim, 5
over several), it asks the runtime what it serves
(``explain``: the bucket's record, or the sub-bucket's where the bucket was split), races that
config against every candidate there and prints the served config's loss over the fastest:
p50, p95 and max over all those sizes, per kernel and in total.

Without ``--measure`` it reads what ``ctbuild tune`` recorded: every candidate raced at the
sizes of each bucket (`ctbuild.tune.span`), the winner's loss there over the fastest. It prints,
per kernel and bucket, the loss at each size, the p95 over all of them, the loss as served (a
size a split point holds counts at its sub-bucket's winner, the others at the bucket's), and
names every unsplit bucket above the threshold with the split that would fix it and why tune
did not. Run it on a cache tuned on a GPU, e.g. the one
`benchmarks/tune_reproducibility.py --workdir DIR` leaves in DIR/a.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    i = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[i]


def bucket_rows(cache: Path) -> list[dict[str, Any]]:
    from ctbuild.cache import Store
    rows = []
    for _, rec in Store(cache).tuning_records():
        regret = rec.get("regret")
        if not regret:
            continue
        sizes = regret.get("sizes", [])
        worst = max(sizes, key=lambda s: s["regret_pct"], default=None)
        refined = rec.get("refined") if isinstance(rec.get("refined"), dict) else {}
        rows.append({"kernel": rec["kernel"], "gpu": rec.get("gpu"),
                     "bucket": regret.get("bucket"), "sizes": sizes,
                     "max_pct": regret.get("max_pct"), "worst": worst,
                     "problems": regret.get("problems", []),
                     "splits": [sp["sizes"] for sp in refined.get("splits", [])],
                     "unsplit": regret.get("unsplit")})
    return sorted(rows, key=lambda r: (r["kernel"], sorted((r["bucket"] or {}).items())))


def _ident(row: dict[str, Any], sizes: Any) -> tuple:
    return row["kernel"], row["gpu"], json.dumps(sizes, sort_keys=True)


def as_served(rows: list[dict[str, Any]]
              ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[float]]:
    """(the declared buckets' rows, the sub-buckets' rows, the regret at every interior size as
    served after
    ``ctbuild tune --refine``): a size a split point holds is served by that sub-bucket's own
    winner, whose record times its regret inside the sub-bucket; the others by the bucket's."""
    subs = {_ident(r, sp) for r in rows for sp in r["splits"]}
    declared = [r for r in rows if _ident(r, r["bucket"]) not in subs]
    sub_rows = [r for r in rows if _ident(r, r["bucket"]) in subs]
    served = [s["regret_pct"] for r in sub_rows for s in r["sizes"]]
    for r in declared:
        served += [s["regret_pct"] for s in r["sizes"]
                   if not any(all(s["sizes"][n] <= v for n, v in sp.items())
                              for sp in r["splits"])]
    return declared, sub_rows, served


#: Sizes drawn per bucket over one Dim, and over several.
CHECK_DRAWS = (4, 5)


def check_sizes(bucket: Any) -> list[dict[str, int]]:
    """Sizes inside ``bucket`` to judge its winners at, drawn log-uniformly per Dim between
    its lower and upper bounds, seeded by the bucket: where the tuner races plays no part in
    where it is judged (fixed fractions of the way once fell one above a size the tuner
    added), so two versions of the tuner are judged at the same sizes. The upper bound (the
    key's own size) is not drawn."""
    import math
    import random
    top, low = dict(bucket.sizes), bucket.lower_bounds()
    rng = random.Random(json.dumps([sorted(top.items()), sorted(low.items())]))
    want = CHECK_DRAWS[0] if len(top) == 1 else CHECK_DRAWS[1]
    out: list[dict[str, int]] = []
    for _ in range(8 * want):
        if len(out) == want:
            break
        sizes = {n: min(top[n], max(low[n], round(math.exp(rng.uniform(
            math.log(low[n]), math.log(top[n] + 1)))))) for n in sorted(top)}
        if sizes != top and sizes not in out:
            out.append(sizes)
    return out


def measured_rows(cache: Path, configs: list[Path], *, also: Sequence[Path] = (),
                  keys: Mapping[str, Mapping[str, dict[str, int]]] | None = None
                  ) -> list[dict[str, Any]]:
    """Per check size of every declared bucket tuned on this GPU: the served config's loss
    over the fastest candidate there, raced interleaved. ``also``: caches of other tunes of
    the same CUBINs, whose served configs run in the same race (each row's ``also``: the
    config and loss per cache). ``keys``: instead, the buckets of these records (JSON of
    ``[kernel, tuning key]``, a row's ``key``: their ``bucket`` and ``lower`` sizes, a
    sub-bucket's too), at their upper bound as well."""
    from ctbuild import runtime
    from ctbuild.arch import Arch
    from ctbuild.cache import Store
    from ctbuild.dims import concretize
    from ctbuild.project import load_project
    from ctbuild.toolchain import toolchain_for
    from ctbuild.tune.choice import TieBand
    from ctbuild.tune.measuring import Benches
    from ctbuild.tune.race import RaceBudget, race
    from ctbuild.tune.tuner import current_device
    device = current_device()
    store = Store(cache)
    fp = toolchain_for(store)
    points = []  # (kernel, bucket, record key, sizes, spec)
    for config in configs:
        for kernel in load_project(config).kernels():
            for bucket in kernel.buckets.values():
                for key, judged in _buckets_of(kernel, bucket, keys):
                    extra = [dict(judged.sizes)] if keys is not None else []
                    for sizes in check_sizes(judged) + extra:
                        points.append((kernel, bucket, key, sizes,
                                       concretize(bucket.declared, sizes)))
    served: list[list[dict[str, Any]]] = [[] for _ in points]
    for where in (cache, *also):  # what each tune's records serve at each point
        runtime.configure(store=Store(where, readonly=True), mode="default")
        for mine, (kernel, _, _, _, spec) in zip(served, points):
            mine.append(kernel.explain(*[spec[p] for p in kernel.params], arch=device.arch,
                                       gpu=device.name))
        runtime.reset()
    rows = []
    benches: dict[str, Any] = {}
    for (kernel, bucket, key, sizes, spec), told in zip(points, served):
        if any(t.get("config_from") != "record" for t in told):
            continue  # not tuned on this GPU
        cands = list(kernel.candidates(spec, Arch(device.arch)).kept)
        won = [next((c for c in cands if c.to_json() == t["config"]), None) for t in told]
        if None in won:
            continue
        bench = benches.setdefault(kernel.name, Benches(kernel, store, fp, device))
        result = race(cands, bench.on_spec(spec).sample,
                      TieBand(1.0), RaceBudget(min_rounds=5, max_rounds=20, max_seconds=1.5))
        times = {t.config: t.mean_us for t in result.timings}
        if any(w not in times for w in won):
            continue
        fastest = min(times, key=lambda c: times[c])
        loss = [round(100 * (times[w] / times[fastest] - 1), 3) for w in won]
        rows.append({"kernel": kernel.name, "bucket": bucket.to_json(), "key": key,
                     "sizes": sizes, "sub_bucket": told[0].get("sub_bucket"),
                     "served": told[0]["config"], "fastest": fastest.to_json(),
                     "regret_pct": loss[0],
                     "also": [{"served": t["config"], "regret_pct": x}
                              for t, x in zip(told[1:], loss[1:])]})
    return rows


def _buckets_of(kernel: Any, bucket: Any, keys: Mapping[str, Mapping[str, dict[str, int]]] | None
                ) -> list[tuple[str, Any]]:
    """(record key, bucket to draw sizes in) for a declared ``bucket``: itself, or with
    ``keys`` the records' buckets inside it (the declared one, or sub-buckets of a split)."""
    from ctbuild.dims import Bucket, concretize

    def key_at(sizes: dict[str, int]) -> str:
        return json.dumps([kernel.name, kernel.tuning_key(concretize(bucket.declared, sizes))])
    if keys is None:
        return [(key_at(dict(bucket.sizes)), bucket)]
    low, top = bucket.lower_bounds(), dict(bucket.sizes)
    out = []
    for key, rec in keys.items():
        upper, lower = rec.get("bucket") or {}, rec.get("lower") or {}
        if set(upper) != set(top) or set(lower) != set(top) or not all(
                low[n] <= lower[n] <= upper[n] <= top[n] for n in top):
            continue
        if key_at(upper) == key:
            out.append((key, Bucket(bucket.declared, tuple(sorted(upper.items())),
                                    tuple(sorted(lower.items())))))
    return out


def print_measured(rows: list[dict[str, Any]], gpu: str) -> None:
    for r in rows:
        print(f"{r['kernel']:<18} bucket {json.dumps(r['bucket'])} at {json.dumps(r['sizes'])}"
              + (f" (sub-bucket {json.dumps(r['sub_bucket'])})" if r["sub_bucket"] else "")
              + f": served {r['served']} {r['regret_pct']:+.2f}% vs {r['fastest']}")
    for name in sorted({r["kernel"] for r in rows}):
        mine = [r["regret_pct"] for r in rows if r["kernel"] == name]
        print(f"{name}: {len(mine)} sizes, served regret p95 {percentile(mine, 95):.2f}%, "
              f"max {max(mine):.2f}%")
    every = [r["regret_pct"] for r in rows]
    print(f"GPU: {gpu}; served regret at {len(every)} sizes drawn inside the buckets: p50 "
          f"{percentile(every, 50):.2f}%, p95 {percentile(every, 95):.2f}%, max "
          f"{max(every, default=0.0):.2f}%")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path, required=True)
    ap.add_argument("--threshold", type=float, default=3.0, help="percent (default: 3)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--measure", action="store_true",
                    help="race the served config at sizes the tuner did not (needs a GPU)")
    ap.add_argument("--config", type=Path, action="append", default=[],
                    help="a project whose kernels to measure (with --measure; repeatable)")
    args = ap.parse_args()
    if args.measure:
        import torch
        if not args.config:
            print("--measure needs --config (the projects the cache was tuned for)",
                  file=sys.stderr)
            return 2
        rows = measured_rows(args.cache, args.config)
        if not rows:
            print(f"no bucket of those projects is tuned on this GPU in {args.cache}",
                  file=sys.stderr)
            return 2
        print_measured(rows, torch.cuda.get_device_name())
        if args.json:
            args.json.write_text(json.dumps({"measured": rows}, indent=1))
        return 0
    rows = bucket_rows(args.cache)
    if not rows:
        print(f"no tuning record in {args.cache} holds a bucket regret: tune a project with "
              "Dim workloads first (ctbuild tune)", file=sys.stderr)
        return 2
    rows, sub_rows, served = as_served(rows)
    every = [s["regret_pct"] for r in rows for s in r["sizes"]]
    above = [r for r in rows if (r["max_pct"] or 0) > args.threshold and not r["splits"]]
    for r in rows:
        cells = "  ".join(f"{json.dumps(s['sizes'])} {s['regret_pct']:+.2f}%" for s in r["sizes"])
        print(f"{r['kernel']:<18} bucket {json.dumps(r['bucket'])}: {cells or 'no interior size'}"
              + (f"  problems: {r['problems']}" if r["problems"] else "")
              + (f"  split at {json.dumps(r['splits'])}" if r["splits"] else ""))
    print(f"GPU: {rows[0]['gpu']}; {len(rows)} buckets, {len(every)} interior sizes; regret "
          f"p50 {percentile(every, 50):.2f}%, p95 {percentile(every, 95):.2f}%, "
          f"max {max(every, default=0.0):.2f}%")
    for r in sub_rows:
        cells = "  ".join(f"{json.dumps(s['sizes'])} {s['regret_pct']:+.2f}%" for s in r["sizes"])
        print(f"{r['kernel']:<18} sub-bucket up to {json.dumps(r['bucket'])}: "
              f"{cells or 'no interior size'}")
    refined = [r for r in rows if r["splits"]]
    if refined:
        print(f"as served after --refine ({len(refined)} buckets split into "
              f"{sum(len(r['splits']) for r in refined)} sub-buckets): {len(served)} interior "
              f"sizes; regret p50 {percentile(served, 50):.2f}%, p95 "
              f"{percentile(served, 95):.2f}%, max {max(served, default=0.0):.2f}%")
    for r in above:
        worst = r["worst"]
        split = worst["sizes"]
        print(f"above {args.threshold:g}%: {r['kernel']} bucket {json.dumps(r['bucket'])}: "
              f"{worst['regret_pct']:.2f}% at {json.dumps(worst['sizes'])} (fastest there "
              f"{worst['fastest']}); split with a bucket bound at {json.dumps(split)}"
              + (f"; tune did not split it: {r['unsplit']}" if r.get("unsplit") else ""))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "p95_pct": percentile(every, 95),
                                         "served_p95_pct": percentile(served, 95)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
