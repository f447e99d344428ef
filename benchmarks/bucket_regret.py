"""How good each `Dim` bucket's winner is at the sizes inside the bucket.

    python benchmarks/bucket_regret.py --cache DIR [--threshold 3] [--json FILE]

``ctbuild tune`` times every bucket's winner and runners-up at the bucket's lower bound and
geometric midpoints (interleaved, like the runoff) and keeps the winner's regret there in the
tuning record: its time over the fastest contender's at that size, minus one. This prints, per
kernel and bucket, the regret at each interior size, the p95 over all interior sizes, and names
every bucket above the threshold with the split that would fix it: a bucket bound at the size
where the regret is worst (``Dim(..., buckets=[...])``), so that size is tuned itself; this is
where ``ctbuild tune --refine`` splits. After ``--refine`` it also prints the regret as
served: a size a split point holds counts at its sub-bucket's winner (whose record times the
regret inside the sub-bucket), the others at the bucket's. Run it on a cache tuned on a GPU,
e.g. the one `benchmarks/tune_reproducibility.py --workdir DIR` leaves in DIR/a.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

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
                     "splits": [sp["sizes"] for sp in refined.get("splits", [])]})
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path, required=True)
    ap.add_argument("--threshold", type=float, default=3.0, help="percent (default: 3)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
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
              f"{worst['fastest']}); split with a bucket bound at {json.dumps(split)}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "p95_pct": percentile(every, 95),
                                         "served_p95_pct": percentile(served, 95)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
