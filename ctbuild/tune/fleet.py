"""``ctbuild tune --gpus``: one measuring process per GPU, one winner for the fleet.

1. **Lanes**: every GPU tunes in its own supervised process (`supervisor.run_isolated`,
   ``CUDA_VISIBLE_DEVICES`` set to that GPU), taking the kernel x workload entries longest
   first by cost (the seconds a key's last record took, else an estimate: candidates times
   the bytes they move, times the sizes a `Dim` bucket is raced at), each entry to the first
   lane free to claim it (`ctbuild.tune.claims`): no share is fixed by estimates, so no lane
   idles while another still has keys. An entry whose process died with no candidate to blame
   goes to the next GPU.
2. **Finals**, with more than one GPU, only for the keys whose winner is not decided: their
   race at their own size ended on its budget with a finalist at the band's edge. Every lane's
   process, its own keys done, waits (`ctbuild.tune.gate`) until all are, then re-measures
   those keys' finalists interleaved (no second process start-up), and the winner is decided
   on the median time across GPUs by the same tie rule, kept with the per-GPU times. A key
   decided in its lane, or whose winner was chosen over a bucket's sizes or per layout class,
   is not measured again. A GPU whose times are more than 3% above the fleet median on the
   same candidates is named.

With one GPU this is the same code path with nothing to merge: the lane decides.
"""
from __future__ import annotations

import concurrent.futures
import json
import math
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..arch import Arch
from ..compile.plan import job_for
from ..records import TuningRecord, stored_tuning
from ..space import Config
from .choice import RULE_SPAN, TieBand, Timing, choose
from .claims import Claims
from .gate import Gate
from .session import Entry, TuneOptions
from .span_sizes import span_sizes
from .supervisor import run_isolated
from .tuner import record_key
from .verify import contenders
from .warm import WarmLanes, lane_env

if TYPE_CHECKING:
    from ctbuild.cache import Store

    from .tuner import Device

#: A GPU this much slower than the fleet median on the same candidates is named in the report.
SLOW_GPU_RATIO = 1.03
#: Seconds of measuring per unit of `estimated_work`'s estimate (candidates x log2 bytes).
ESTIMATE_SECONDS = 0.005


class GpuListError(ValueError):
    """A ``--gpus`` value that names no GPU of this node."""


def parse_gpus(text: str, visible: int) -> list[int]:
    """``all`` or comma-separated indices (a GPU named twice gets two measuring processes)."""
    if text.strip() == "all":
        if visible == 0:
            raise GpuListError("--gpus all: no CUDA GPU is visible")
        return list(range(visible))
    try:
        gpus = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise GpuListError(f"--gpus {text!r}: give 'all' or GPU indices such as 0,1") from None
    if not gpus:
        raise GpuListError("--gpus names no GPU: give 'all' or GPU indices such as 0,1")
    if bad := [g for g in gpus if not 0 <= g < visible]:
        shows = f"{visible} GPU(s), indices 0..{visible - 1}" if visible else "no CUDA GPU"
        raise GpuListError(f"--gpus names GPU {bad[0]}, which is not there: this node shows "
                           f"{shows}")
    return gpus


def estimated_work(entry: Entry, arch: str, cap: int, store: Store | None = None,
                   device: Device | None = None, fp: str = "") -> float:
    """An entry's cost: the seconds its last record took to measure, else an estimate
    (candidates times the log of the bytes its tensors move, times the sizes its bucket is
    raced at), in comparable units: `ESTIMATE_SECONDS` per unit."""
    if store is not None and device is not None:
        rec = stored_tuning(store, record_key(entry.kernel, entry.workload, device, fp))
        if rec is not None and isinstance(rec.measure_seconds, (int, float)) \
                and rec.measure_seconds > 0:
            return float(rec.measure_seconds)
    try:
        n = len(entry.kernel.candidates(entry.workload, Arch(arch), cap).kept)
    except Exception:  # noqa: BLE001 - unplannable entries fail fast in their lane
        n = 1
    volume = sum(getattr(v, "numel", lambda: 1)() * getattr(v, "itemsize", 1)
                 for v in entry.workload.values() if hasattr(v, "numel"))
    bucket = entry.kernel.buckets.get(entry.workload)
    sizes = 1 + (len(span_sizes(bucket)) if bucket is not None else 0)
    return ESTIMATE_SECONDS * n * math.log2(2 + volume) * sizes


def longest_first(entries: Sequence[Entry], work: Callable[[Entry], float]) -> list[Entry]:
    """The order the lanes claim entries in: the most work first (``work`` asked once an
    entry: it may read the entry's record), so the last keys taken are short ones."""
    costs = [work(e) for e in entries]
    return [e for _, _, e in sorted(zip(costs, range(len(costs)), entries),
                                    key=lambda c: (-c[0], c[1]))]


@dataclass
class FleetRun:
    """What the lanes share: the project, the cache, the options, the GPUs."""
    config_path: str | None
    cache_dir: str
    opts: TuneOptions
    gpus: list[int]
    only: Sequence[str] = ()
    #: whether each lane's process sees only its GPU (``--gpus``); else it inherits the
    #: environment and measures on the current GPU
    pin: bool = True
    #: where the first lanes wait for the identity check (`ctbuild.tune.gate`; None: none)
    gate: Gate | None = None
    #: the processes started for the lanes before the plan (`ctbuild.tune.warm`)
    warm: WarmLanes | None = None

    def env(self, i: int) -> dict[str, str] | None:
        """The lane's ``CUDA_VISIBLE_DEVICES`` (`lane_env`; None: the current GPU's)."""
        return lane_env(self.gpus[i]) if self.pin else None

    def lane(self, i: int, entries: Sequence[Entry],
             emit: Callable[[dict[str, Any]], None] | None = None,
             finals: Finals | None = None, claims: Path | None = None
             ) -> list[dict[str, Any]]:
        """Run ``entries`` in a supervised process on GPU ``gpus[i]`` (which then waits for
        the ``finals``, where given); with ``claims``, those of them it claims first."""
        return run_isolated(self.config_path, self.cache_dir, entries, self.opts,
                            only=self.only, emit=emit, env=self.env(i), gate=self.gate,
                            finals=finals.gate if finals else None,
                            on_event=finals.seen(i) if finals else None,
                            claims=Claims(claims, i) if claims else None,
                            warm=self.warm.take(self.env(i)) if self.warm else None)

    def each_lane(self, shares: Sequence[Sequence[Entry]],
                  emit: Callable[[dict[str, Any]], None] | None = None,
                  finals: Finals | None = None,
                  between: Callable[[list[concurrent.futures.Future]], None] | None = None,
                  claims: Path | None = None) -> list[list[dict[str, Any]]]:
        """Each share on its GPU at once (with ``claims``, the entries each lane claimed of
        its share); ``between(futures)`` runs while they do."""
        with concurrent.futures.ThreadPoolExecutor(len(self.gpus)) as pool:
            futures = [pool.submit(self.lane, i, share, emit, finals, claims)
                       for i, share in enumerate(shares) if share]
            if between is not None:
                between(futures)
            done = [f.result() for f in futures]
        it = iter(done)
        return [next(it) if share else [] for share in shares]


class Finals:
    """The finals of one fleet tune: each lane's process, its keys tuned, says ``idle`` and
    waits at ``gate`` (`ctbuild.tune.gate`) for the configs to re-measure; what was posted
    (configs per entry index), how long the lanes took to be idle, what each lane timed, per
    entry."""

    def __init__(self, gate: Gate, lanes: int) -> None:
        self.gate, self.lanes = gate, lanes
        self.idle: set[int] = set()
        self.posted: dict[int, list[dict[str, Any]]] = {}
        self.waited = 0.0
        self.timed: dict[int, dict[int, dict[str, Any]]] = {}
        self.ready = threading.Event()
        self._lock = threading.Lock()

    def seen(self, lane: int) -> Callable[[dict[str, Any]], None]:
        def on_event(ev: dict[str, Any]) -> None:
            with self._lock:
                if ev["event"] == "idle":
                    self.idle.add(lane)
                    if len(self.idle) == self.lanes:
                        self.ready.set()
                elif ev["event"] == "finals":
                    self.timed.setdefault(int(ev["entry"]), {})[lane] = ev["summary"]
        return on_event

    def run(self, futures: list[concurrent.futures.Future],
            payload: Callable[[], dict[int, list[dict[str, Any]]]]) -> None:
        """Once every lane is idle (or gone), post ``payload()`` (configs per entry; nothing
        when it raises, and the lanes exit)."""
        start = time.perf_counter()
        try:
            while not self.ready.wait(0.05):
                if all(f.done() for f in futures):
                    break
            self.waited = time.perf_counter() - start
            self.posted = payload()
        finally:
            self.gate.post(json.dumps({str(k): v for k, v in self.posted.items()}))


def lost(summary: dict[str, Any]) -> bool:
    """Whether an entry failed because its process died with nothing to blame."""
    note = str(summary.get("note", ""))
    return summary["status"] == "failed" and summary.get("record") is None and (
        note.startswith("tuning process died") or note.startswith("stalled"))


def tune_fleet(run: FleetRun, entries: Sequence[Entry], store: Store, device: Device, fp: str,
               emit: Callable[[dict[str, Any]], None] | None = None
               ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Tune on every GPU (``emit`` gets each entry's summary as its lane finishes it), then,
    with several lanes, the finals in the same processes: every lane re-measures the keys
    still `undecided` and the fleet's median decides. (final summaries in entry order, fleet
    report)."""
    many = len(run.gpus) > 1
    order = longest_first(entries, lambda e: estimated_work(
        e, device.arch, run.opts.cap, store, device, fp)) if many else list(entries)
    shares = [order] * len(run.gpus)
    results: dict[int, dict[str, Any]] = {}

    def keep(s: dict[str, Any]) -> None:
        results[s["entry"]] = s
        if emit:
            emit(s)

    def finals_of() -> dict[int, list[dict[str, Any]]]:
        if any(lost(s) for s in results.values()):  # moved first; those keys are not re-run
            return {}
        records = {e.index: TuningRecord.from_json(results[e.index]["record"]) for e in entries
                   if results.get(e.index, {}).get("status") == "tuned"}
        return {i: contenders(rec) for i, rec in records.items() if undecided(rec)}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ctbuild-fleet-") as tmp:
        fin = Finals(Gate(Path(tmp) / "finals"), len(run.gpus)) if many and entries else None
        claims = Path(tmp) / "claims" if many else None
        if claims:
            claims.mkdir()
        screened = run.each_lane(shares, emit=keep, finals=fin, between=None if fin is None
                                 else lambda futures: fin.run(futures, finals_of),
                                 claims=claims)
    wall = time.perf_counter() - start
    retry = [e for e in entries if e.index in results and lost(results[e.index])]
    moved = []
    if retry and len(run.gpus) > 1:
        again = [[] for _ in run.gpus]  # type: list[list[Entry]]
        for k, e in enumerate(retry):
            again[(k + 1) % len(run.gpus)].append(e)
        for lane in run.each_lane(again, emit=emit):
            for s in lane:
                results[s["entry"]] = {**s, "note": (s.get("note", "") + " (moved to another "
                                                     "GPU after its process died)").strip()}
                moved.append(s["entry"])
    screen_wall = fin.waited if fin is not None else wall
    report: dict[str, Any] = {"gpus": run.gpus, "moved": moved, "slow_gpus": [],
                              "screen_wall_s": round(screen_wall, 3),
                              "lanes": [lane_summary(g, lane) for g, lane in zip(run.gpus,
                                                                                 screened)]}
    if fin is not None:
        open_keys = [e for e in entries if e.index in fin.posted]
        report["finals_keys"] = len(open_keys)
        report["slow_gpus"] = finals(run, open_keys, fin, results, store, device, fp)
        report["finals_wall_s"] = round(wall - screen_wall, 3)
    return [results[e.index] for e in entries if e.index in results], report


def lane_summary(gpu: int, lane: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One lane's share of the measuring: its entries and the seconds its records spent
    measuring, every phase (the part that more GPUs divide; each lane's process start-up is
    not in it)."""
    measured = sum((s.get("record") or {}).get("measure_seconds") or 0.0 for s in lane)
    return {"gpu": gpu, "entries": len(lane), "measure_s": round(measured, 3)}


def finals(run: FleetRun, tuned: Sequence[Entry], fin: Finals,
           results: dict[int, dict[str, Any]], store: Store, device: Device, fp: str
           ) -> list[dict[str, Any]]:
    """The fleet median of what every lane timed of the ``tuned`` entries' finalists decides
    their winners (an entry some lane did not time keeps its lane's). Rewrites their records
    and summaries; returns the GPUs slower than the fleet by `SLOW_GPU_RATIO`."""
    times: dict[int, list[dict[str, Timing]]] = {}
    for e in tuned:
        timed = fin.timed.get(e.index, {})
        times[e.index] = [{json.dumps(t["config"], sort_keys=True): Timing(
            Config(t["config"], e.kernel.name), t["mean_us"], t["ci_us"], t["samples"])
            for t in lane["timings"]} for _, lane in sorted(timed.items())]
    band = TieBand(run.opts.tie_band)
    for e in tuned:
        if len(times[e.index]) == len(run.gpus):
            results[e.index] = merged(e, results[e.index], times[e.index], store, device, fp,
                                      band, run)
    return slow_gpus(run.gpus, [times[e.index] for e in tuned])


def undecided(rec: TuningRecord) -> bool:
    """Whether a key's winner is worth measuring on every GPU: its race at its own size ran
    out of budget before every finalist was a sure tie or surely slower, and the winner was
    chosen there (not over a bucket's sizes or per layout class, which the fleet's finals do
    not measure)."""
    race = rec.runoff if isinstance(rec.runoff, dict) else {}
    rule = rec.choice.get("rule") if isinstance(rec.choice, dict) else None
    splits = rec.refined.get("splits") if isinstance(rec.refined, dict) else None
    return str(race.get("stopped", "")).startswith("budget") and rule != RULE_SPAN \
        and not splits and not rec.by_class


def merged(e: Entry, summary: dict[str, Any], lanes: list[dict[str, Timing]], store: Store,
           device: Device, fp: str, band: TieBand, run: FleetRun) -> dict[str, Any]:
    """The entry's record and summary with the fleet's winner (median across GPUs)."""
    common = set.intersection(*(set(t) for t in lanes))
    fleet = [Timing(lanes[0][k].config, statistics.median(t[k].mean_us for t in lanes),
                    statistics.median(t[k].ci_us for t in lanes),
                    sum(t[k].samples for t in lanes)) for k in sorted(common)]
    if not fleet:
        return summary
    cands = e.kernel.candidates(e.workload, Arch(device.arch), run.opts.cap)
    choice = choose(fleet, list(cands.kept), cands.default, band)
    rec = TuningRecord.from_json(summary["record"])
    win = choice.winner
    rec.config, rec.mean_us, rec.ci_us = win.config.to_json(), win.mean_us, win.ci_us
    rec.compile_key = job_for(e.kernel, win.config, e.workload, device.arch, fp).key
    rec.choice = {"rule": choice.rule, "band": band.to_json(), "fleet": True,
                  "fastest": choice.fastest.config.to_json(),
                  "ties": [t.to_json() for t in choice.ties]}
    rec.fleet = {"gpus": run.gpus, "per_gpu": [[t.to_json() for t in lane.values()]
                                               for lane in lanes]}
    store.put_tuning(summary["record_key"], rec.to_json())
    return {**summary, "winner": rec.config, "mean_us": rec.mean_us, "ci_us": rec.ci_us,
            "record": rec.to_json()}


def slow_gpus(gpus: Sequence[int], per_entry: Sequence[Sequence[dict[str, Timing]]]
              ) -> list[dict[str, Any]]:
    """GPUs whose median ratio to the fleet median (same entries, same configs) exceeds
    `SLOW_GPU_RATIO`."""
    ratios: list[list[float]] = [[] for _ in gpus]
    for lanes in per_entry:
        if len(lanes) != len(gpus):
            continue
        for k in set.intersection(*(set(t) for t in lanes)):
            mid = statistics.median(t[k].mean_us for t in lanes)
            for i, t in enumerate(lanes):
                ratios[i].append(t[k].mean_us / mid)
    return [{"lane": i, "gpu": g, "ratio": round(statistics.median(r), 4)}
            for i, (g, r) in enumerate(zip(gpus, ratios))
            if r and statistics.median(r) > SLOW_GPU_RATIO]
