"""Two independent tunes of the same keys on one GPU: do they pick the same winners?

    python benchmarks/tune_reproducibility.py [--config C ...] [--tie-band 2] [--json FILE]

1. Precompile every planned candidate of each project (default: benchmarks/kernels/tune_all.toml,
   the examples, the coverage fixture's `Dim` kernels and the heavy kernels over `Dim`s) for
   this GPU's arch with `ctbuild precompile --farm local` (no Ray), into cache A; copy it to cache B (the
   same CUBINs, no tuning records).
2. ``ctbuild tune`` each project into A, then into B (fresh processes, timed).
3. Compare the records key by key and print, in one run:
   - the agreement of the winners (the tie rule's, and each layout class's own where a
     record has one: two records agree where they serve every call alike), and of the
     fastest screened candidate (what the tuner picked before the tie rule and the runoff),
     for comparison;
   - the regret of every disagreement: each run's winner timed in the other run's data
     (its runoff times where both configs were finalists there, else its screening times);
   - each run's tune time, and its measuring time against the part spent screening (cuTile's
     search alone, what tuning cost before the output check, the race and the buckets' sizes),
     and against the screening as it ran before the first launches moved into the measuring
     process (cuTile's search with its timed subprocess, timed after both tunes).

A key's own winner is compared on its race (else screening) times, in each run's data. A
disagreement at a `Dim` bucket is measured on the GPU after both tunes: the records cannot judge
it (a run that split the bucket serves most of its sizes from another record; a wave table
chooses per call; a record times each config only at its own sizes). At the bucket's upper
bound and the sizes `bucket_regret.py --measure` draws inside it, what each run serves there
(`explain` on each cache) races every candidate, and the two runs' worst losses are compared:
within the band of each other is inside the tie set. Without a GPU's answer (a size neither
serves from a record), the records judge: a bucket's winner on its worst loss over the bucket's
sizes, two records with the same winner on their class configs over the other's raced sizes,
or not judged where a wave table chooses.

Targets (an H100 or H200): agreement of at least 98% of keys, every disagreement inside the
other run's tie set, measuring at most 1.5x the screening (as before: the issue's baseline).
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for p in (str(ROOT), str(ROOT / "tests")):
    if p not in sys.path:
        sys.path.insert(0, p)

from ctbuild.space import Config  # noqa: E402
from ctbuild.tune.choice import TieBand, Timing, ties_with  # noqa: E402

DEFAULT_CONFIGS = [ROOT / "benchmarks" / "kernels" / "tune_all.toml"]


def precompile_all(cache: Path, configs: list[Path], arch: str) -> None:
    """Every planned candidate of every project for ``arch``: ``ctbuild precompile --farm
    local`` (worker processes, no Ray), as a build would; its TileIR identity check leaves the
    memo that spares ``ctbuild tune`` the same check, as after a real build."""
    for config in configs:
        r = subprocess.run([sys.executable, "-m", "ctbuild", "precompile", "--config",
                            str(config), "--cache", str(cache), "--arch", arch, "--farm",
                            "local", "--json"], capture_output=True, text=True, cwd=ROOT)
        if r.returncode != 0:
            sys.exit(f"precompile {config} failed ({r.returncode}): {r.stderr[-2000:]}")
        out = json.loads(r.stdout)
        print(f"precompile: {out.get('jobs')} jobs, {out.get('compiled')} compiled in "
              f"{out.get('seconds', 0):.1f} s", flush=True)


def tune(config: Path, cache: Path, *flags: str) -> tuple[float, dict[str, Any]]:
    """(wall seconds, the --json document) of ``ctbuild tune`` in a fresh process."""
    start = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "ctbuild", "tune", "--config", str(config),
                        "--cache", str(cache), "--json", *flags],
                       capture_output=True, text=True, cwd=ROOT)
    seconds = time.perf_counter() - start
    if r.returncode not in (0, 1):
        sys.exit(f"tune {' '.join(flags)} failed ({r.returncode}): {r.stderr[-2000:]}")
    return seconds, json.loads(r.stdout)


def records(cache: Path) -> dict[str, dict[str, Any]]:
    """Tuning records by (kernel, tuning key) text."""
    from ctbuild.cache import Store
    return {json.dumps([rec["kernel"], rec["tuning_key"]]): rec
            for _, rec in Store(cache).tuning_records() if rec.get("config") is not None}


def _time_in(rec: dict[str, Any], cfg: dict[str, Any], other: dict[str, Any]
             ) -> tuple[float, float, str] | None:
    """(time of ``cfg``, time of ``other``) in one record's data: runoff times where both ran
    off, else screening times."""
    for source, rows in (("runoff", (rec.get("runoff") or {}).get("finalists", [])),
                         ("screen", rec.get("candidates", []))):
        by = {json.dumps(r["config"], sort_keys=True): r["mean_us"] for r in rows}
        a, b = by.get(json.dumps(cfg, sort_keys=True)), by.get(json.dumps(other, sort_keys=True))
        if a and b:
            return a, b, source
    return None


def _span_tie(rec: dict[str, Any], cfg: dict[str, Any], band_pct: float
              ) -> tuple[float, bool] | None:
    """(how much worse ``cfg``'s worst loss over the bucket's sizes is than the winner's, in
    ``rec``'s data; whether it is in the record's tie set: the tie rule (`ties_with`) ties it
    with the smallest worst loss, with their CIs where the record has them), for a bucket
    record (None: not one)."""
    regret = rec.get("regret") or {}
    worst = {json.dumps(t["config"], sort_keys=True): (t["worst_pct"], t.get("ci_pct") or 0.0)
             for t in regret.get("worst") or []}
    own = worst.get(json.dumps(rec["config"], sort_keys=True))
    mine = worst.get(json.dumps(cfg, sort_keys=True))
    if own is None or mine is None:
        return None
    best = min(worst.values())
    pct = 100 * ((1 + mine[0] / 100) / (1 + own[0] / 100) - 1)
    as_time = [Timing(Config({}), 1 + w / 100, ci / 100, 1) for w, ci in (mine, best)]
    return pct, ties_with(as_time[0], as_time[1], TieBand(band_pct))


def _class_tie(mine: dict[str, Any], rec: dict[str, Any], band_pct: float
               ) -> tuple[float, bool] | None:
    """For two records with the same winner that serve some layout class differently: how
    much worse the worst loss over ``rec``'s raced sizes is with ``mine``'s config for each
    size's class than with ``rec``'s own, and whether the two worst losses tie (None: at some
    size ``mine`` serves a config ``rec`` has no time of there, or a wave table chooses)."""
    def config_for(r: dict[str, Any], cls: str | None) -> Any:
        entry = (r.get("by_class") or {}).get(cls) or {}
        return None if entry.get("waves") else entry.get("config", r["config"])
    worst_mine = worst_own = 0.0
    for row in (rec.get("regret") or {}).get("sizes") or []:
        chosen, own = config_for(mine, row.get("layout_class")), row.get("served", rec["config"])
        if chosen == own:
            loss = row["regret_pct"]
        elif chosen is not None and chosen == row["fastest"]:
            loss = 0.0
        else:
            return None
        worst_mine, worst_own = max(worst_mine, loss), max(worst_own, row["regret_pct"])
    return _losses_tie(worst_mine, worst_own, band_pct)


def _losses_tie(worst: float, other: float, band_pct: float) -> tuple[float, bool]:
    """(how much slower a worst loss of ``worst`` percent serves than one of ``other``, in
    percent; whether the tie rule (`ties_with`) ties the two)."""
    as_time = [Timing(Config({}), 1 + w / 100, 0.0, 1) for w in (worst, other)]
    return (100 * (as_time[0].mean_us / as_time[1].mean_us - 1),
            ties_with(as_time[0], as_time[1], TieBand(band_pct)))


def _fastest_screened(rec: dict[str, Any]) -> str:
    return json.dumps(min(rec["candidates"], key=lambda c: c["mean_us"])["config"],
                      sort_keys=True)


def same_served(ra: dict[str, Any], rb: dict[str, Any]) -> bool:
    """Whether two records of a key serve every call alike: the same winner, and for each
    layout class either gives its own (``by_class``) the same config and, where a class's
    calls choose by waves, the same finalists and blocks at once."""
    def served(rec: dict[str, Any], cls: str) -> tuple[Any, Any, Any]:
        entry = (rec.get("by_class") or {}).get(cls) or {}
        waves = entry.get("waves") or {}
        return entry.get("config", rec["config"]), waves.get("finalists"), waves.get("slots")
    classes = {**(ra.get("by_class") or {}), **(rb.get("by_class") or {})}
    return ra["config"] == rb["config"] and all(served(ra, c) == served(rb, c) for c in classes)


def _judge(ra: dict[str, Any], rb: dict[str, Any], band_pct: float
           ) -> tuple[float, list[str], bool | None]:
    """Two records of a key that serve it otherwise: (the regret, where each winner was timed
    in the other's data, whether each is in the other's tie set; None: not judged)."""
    if ra["config"] == rb["config"]:  # a layout class served otherwise
        judged = [_class_tie(mine, rec, band_pct) for mine, rec in ((ra, rb), (rb, ra))]
        known = [j for j in judged if j is not None]
        inside = None if len(known) < 2 else all(j[1] for j in known)
        return max([0.0, *(j[0] for j in known)]), ["classes"], inside
    worst, where, tied = 0.0, [], True
    for mine, theirs, rec in ((ra, rb, rb), (rb, ra, ra)):
        span = _span_tie(rec, mine["config"], band_pct)
        if span is not None:  # a bucket's winner: its worst loss over the sizes there
            worst, tied = max(worst, span[0]), tied and span[1]
            where.append("span")
            continue
        found = _time_in(rec, mine["config"], theirs["config"])
        if found:
            t_mine, t_theirs, source = found
            worst = max(worst, 100 * (t_mine / t_theirs - 1))
            tied = tied and any(t["config"] == mine["config"]
                                for t in (rec.get("choice") or {}).get("ties", []))
            where.append(source)
    return worst, where, tied


def compare(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]], band_pct: float
            ) -> dict[str, Any]:
    keys = sorted(set(a) & set(b))
    agree = old_agree = 0
    regrets: list[dict[str, Any]] = []
    for k in keys:
        ra, rb = a[k], b[k]
        old_agree += _fastest_screened(ra) == _fastest_screened(rb)
        if same_served(ra, rb):
            agree += 1
            continue
        worst, where, inside = _judge(ra, rb, band_pct)
        regrets.append({"key": k, "a": ra["config"], "b": rb["config"],
                        "regret_pct": round(worst, 3), "timed_in": where,
                        "in_other_tie_set": inside,
                        "rule_a": (ra.get("choice") or {}).get("rule"),
                        "rule_b": (rb.get("choice") or {}).get("rule")})
    return {"keys": len(keys), "agree": agree, "agree_pct": 100 * agree / max(1, len(keys)),
            "fastest_screened_agree_pct": 100 * old_agree / max(1, len(keys)),
            "disagreements": regrets}


def measured_judgment(disagreements: list[dict[str, Any]], ra: dict[str, dict[str, Any]],
                      cache_a: Path, cache_b: Path, configs: list[Path], band_pct: float
                      ) -> None:
    """Judge the disagreements at `Dim` buckets on the GPU, replacing the records' judgment:
    a record holds no time of a config the other run serves at most sizes (a split moves a
    size to another record, a wave table chooses per call). At the bucket's upper bound and
    the sizes `bucket_regret.check_sizes` draws inside it, both runs' served configs
    (`TunedKernel.explain` on each cache) race every candidate; a disagreement is inside
    the tie set where the tie rule ties the two worst losses (within the band)."""
    from bucket_regret import measured_rows
    keys = {d["key"]: ra[d["key"]]["regret"] for d in disagreements
            if ra[d["key"]].get("regret")}
    if not keys:
        return
    worst: dict[str, list[float]] = {}
    for row in measured_rows(cache_a, configs, also=[cache_b], keys=keys):
        mine = worst.setdefault(row["key"], [0.0, 0.0, 0])
        mine[0] = max(mine[0], row["regret_pct"])
        mine[1] = max(mine[1], row["also"][0]["regret_pct"])
        mine[2] += 1
    for d in disagreements:
        if d["key"] in worst:
            wa, wb, n = worst[d["key"]]
            gap, tied = _losses_tie(max(wa, wb), min(wa, wb), band_pct)
            d.update({"regret_pct": round(gap, 3), "timed_in": [f"measured at {n} sizes"],
                      "in_other_tie_set": tied,
                      "measured_worst_pct": {"a": wa, "b": wb, "sizes": n}})


def _tie_word(inside: bool | None) -> str:
    if inside is None:
        return "not judged: a wave table or an untimed config serves a class"
    return f"{'inside' if inside else 'OUTSIDE'} the other's tie set"


def screening_seconds(recs: dict[str, dict[str, Any]]) -> float:
    return sum((r.get("phase_seconds") or {}).get("screen", 0.0) for r in recs.values())


def phase_total(recs: dict[str, dict[str, Any]],
                phases: tuple[str, ...] = ("screen", "check", "runoff", "span")) -> float:
    return sum((r.get("phase_seconds") or {}).get(p, 0.0) for r in recs.values() for p in phases)


def screening_before(cache: Path, configs: list[Path]) -> float:
    """Seconds of the screening as ``ctbuild tune`` ran it before its first launches moved
    into the measuring process: cuTile's exhaustive search over every key's candidates, each
    candidate's first launch in cuTile's timed subprocess (10 s timeout), on this GPU in this
    run, so that the tunes' measuring is compared with it in one run."""
    import torch

    from ctbuild.cache import Store
    from ctbuild.project import load_project
    from ctbuild.toolchain import toolchain_for
    from ctbuild.tune.measuring import Benches
    from ctbuild.tune.session import entries_for
    from ctbuild.tune.tuner import arrivals, current_device, plan_candidates
    device, store = current_device(), Store(cache, readonly=True)
    fp, total = toolchain_for(store), 0.0
    with torch.cuda.device(device.index):
        for config in configs:
            project = load_project(config)
            for e in entries_for(project.kernels()):
                plan = plan_candidates(e.kernel, e.workload, device.arch, fp, project.cap,
                                       None, {})
                order, n = arrivals(plan, e.kernel, store, device.arch, fp, None, False)
                bench = Benches(e.kernel, store, fp, device).on_spec(e.workload)
                started = time.perf_counter()
                if n:
                    bench.screen(n, order, 10.0)
                total += time.perf_counter() - started
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", action="append", type=Path,
                    help="project(s) to tune (default: benchmarks/kernels/tune_all.toml: the "
                         "examples, the coverage fixture, the heavy kernels over Dims)")
    ap.add_argument("--tie-band", default="2")
    ap.add_argument("--arch", default="sm_90",
                    help="this GPU's arch (asked before CUDA starts: the pool forks)")
    ap.add_argument("--workdir", type=Path, help="keep the caches here (default: a temp dir)")
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    args = ap.parse_args()
    configs = args.config or DEFAULT_CONFIGS
    work = args.workdir or Path(tempfile.mkdtemp(prefix="ctbuild-repro-"))
    arch = args.arch
    cache_a, cache_b = work / "a", work / "b"
    precompile_all(cache_a, configs, arch)
    shutil.copytree(cache_a, cache_b)
    times: dict[str, float] = {"a": 0.0, "b": 0.0}
    gpu = ""
    for run, cache in (("a", cache_a), ("b", cache_b)):
        for config in configs:
            seconds, out = tune(config, cache, "--tie-band", args.tie_band)
            times[run] += seconds
            gpu = out["gpu"]
    ra, rb = records(cache_a), records(cache_b)
    result = compare(ra, rb, float(args.tie_band.rstrip("%")))
    measured_judgment(result["disagreements"], ra, cache_a, cache_b, configs,
                      float(args.tie_band.rstrip("%")))
    before = screening_before(cache_a, configs)
    regrets = [d["regret_pct"] for d in result["disagreements"]]
    result.update({
        "gpu": gpu, "tie_band_pct": float(args.tie_band.rstrip("%")),
        "tune_seconds": times,
        "measure_seconds": {"a": phase_total(ra), "b": phase_total(rb)},
        "added_seconds": {"a": phase_total(ra, ("check", "runoff", "span")),
                          "b": phase_total(rb, ("check", "runoff", "span"))},
        "runoff_seconds": {"a": phase_total(ra, ("runoff",)), "b": phase_total(rb, ("runoff",))},
        "screen_seconds": {"a": screening_seconds(ra), "b": screening_seconds(rb)},
        "screen_before_seconds": before,
        "outside_tie_sets": sum(d["in_other_tie_set"] is False
                                for d in result["disagreements"]),
        "not_judged": sum(d["in_other_tie_set"] is None for d in result["disagreements"]),
        "regret_median_pct": statistics.median(regrets) if regrets else 0.0,
        "regret_max_pct": max(regrets, default=0.0)})
    print(f"GPU: {gpu}; {result['keys']} keys; tie band {args.tie_band}%")
    print(f"winner agreement: {result['agree']}/{result['keys']} "
          f"({result['agree_pct']:.1f}%); fastest-screened agreement (no tie rule, no runoff): "
          f"{result['fastest_screened_agree_pct']:.1f}%")
    for d in result["disagreements"]:
        served = d.get("measured_worst_pct")
        losses = (f"; worst served loss a {served['a']:.2f}%, b {served['b']:.2f}%"
                  if served else "")
        print(f"  differs: {d['key']}  a={d['a']} ({d['rule_a']})  b={d['b']} ({d['rule_b']})  "
              f"regret {d['regret_pct']:.2f}% (timed in {', '.join(d['timed_in']) or '-'}"
              f"{losses}; {_tie_word(d['in_other_tie_set'])})")
    print(f"regret of disagreements: median {result['regret_median_pct']:.2f}%, "
          f"max {result['regret_max_pct']:.2f}%")
    print(f"disagreements outside the other run's tie set: {result['outside_tie_sets']}; "
          f"not judged (a wave table serves a class): {result['not_judged']}")
    for run in ("a", "b"):
        m, s = result["measure_seconds"][run], result["screen_seconds"][run]
        added, runoff_s = result["added_seconds"][run], result["runoff_seconds"][run]
        check_s = phase_total(ra if run == "a" else rb, ("check",))
        wall = times[run]
        print(f"run {run}: tune {wall:.1f} s wall; measuring {m:.1f} s = {m / s:.2f}x the "
              f"screening alone ({s:.1f} s): output check {check_s:.1f} s, race at the keys' "
              f"own sizes {runoff_s:.1f} s, the buckets' other sizes "
              f"{added - runoff_s - check_s:.1f} s; {m / before:.2f}x the screening as "
              f"before ({before:.1f} s: first launches in cuTile's subprocess)")
    by_kernel: dict[str, dict[str, float]] = {}
    for rec in ra.values():
        mine = by_kernel.setdefault(rec["kernel"], {})
        for phase, secs in (rec.get("phase_seconds") or {}).items():
            mine[phase] = mine.get(phase, 0.0) + secs
    for name, phases in sorted(by_kernel.items(), key=lambda kv: -sum(kv[1].values())):
        print(f"  {name:<20} " + ", ".join(f"{p} {v:.2f} s" for p, v in phases.items()))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
