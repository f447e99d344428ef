"""Serving coverage on a GPU: every call in a declared range starts warm, nothing compiles.

    python tests/gpu/coverage_check.py --workdir /tmp/covcheck --stage all

Stages (each can run alone, in order; ``all`` runs them in one go):

- ``build``: ``ctbuild precompile`` + ``ctbuild tune`` of tests/fixtures/coverage_project (a
  matmul with Dim("M", 1, 8192), an add over a 1-D length, a row reduction over rows, a
  persistent kernel whose grid uses ``dev.sm_count``) into WORKDIR/cache.
- ``serve``: in a fresh strict process where tileiras cannot be found (cuTile's compiler lookup
  raises as on a serving image without it; compiles are counted): per kernel 200 random sizes
  (1, 17, 4095, 8191 among them) and 20 misaligned or transposed views, each checked against
  torch; 0 compiles and 0 misses; provenance by CUBIN class. The persistent kernel over 40
  sizes. Then the relaxed CUBIN at M=4095 timed against the exact one at M=4096 (within 5%).
  Then, in a CPU-only process (no GPU visible), ``explain(..., arch=...)`` of every served
  layout must agree with what the GPU run served (class, compile key, config).
- ``loop``: a workload first seen at run time (K=1000, outside every declaration) is served
  (default mode, no tileiras) and recorded; ``precompile --from-record`` and ``tune`` follow;
  a fresh strict process must then hit its own record and exact CUBIN.

Prints one ``PASS``/``FAIL`` line per check with its numbers; exits 1 if any check failed.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ROOT / "tests" / "fixtures" / "coverage_project"
CONFIG = PROJECT / "ctbuild.toml"
KERNELS = ("dyn_matmul", "dyn_add", "dyn_center_rows")
FAILED: list[str] = []


def check(ok: bool, what: str, detail: str = "") -> bool:
    print(f"{'PASS' if ok else 'FAIL'} {what}{': ' + detail if detail else ''}", flush=True)
    if not ok:
        FAILED.append(what)
    return ok


def _pythonpath(*first: Path) -> str:
    """``first`` ahead of the inherited PYTHONPATH (where a GPU host keeps carried packages)."""
    return os.pathsep.join([*map(str, first), *filter(None, [os.environ.get("PYTHONPATH")])])


def ctbuild(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "ctbuild", *args]
    print("$ ctbuild " + " ".join(args), flush=True)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": _pythonpath(ROOT),
                                               **(env or {})}, text=True, capture_output=True)
    print((proc.stdout[-3000:] + proc.stderr[-3000:]).rstrip())
    print(f"  (exit {proc.returncode}, {time.perf_counter() - start:.1f} s)", flush=True)
    return proc


def child(stage: str, workdir: Path, *extra: str, gpu: bool = True,
          env: dict[str, str] | None = None) -> int:
    """Run a stage body in a fresh process (a fresh runtime, as a restarted server has)."""
    full = {**os.environ, "PYTHONPATH": _pythonpath(ROOT, PROJECT), **(env or {})}
    if not gpu:
        full["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run([sys.executable, __file__, "--child", stage, "--workdir",
                           str(workdir), *extra], env=full, text=True)
    return proc.returncode


# ---- in the child: no tileiras, compiles counted -------------------------------------------
COMPILES = [0]


def hide_tileiras() -> None:
    """Make cuTile's compiler lookup fail as it does where tileiras is not installed, and count
    every attempt to compile."""
    import cuda.tile._compile as cc

    def absent() -> Any:
        raise FileNotFoundError("'tileiras' compiler not found (hidden by coverage_check)")

    original = cc.compile_tile

    def counting(*a: Any, **k: Any) -> Any:
        COMPILES[0] += 1
        return original(*a, **k)

    cc._find_compiler_bin = absent
    cc.compile_tile = counting


def sizes_for(hi: int, rng: random.Random) -> list[int]:
    fixed = [n for n in (1, 17, 4095, 8191) if n <= hi]
    return fixed + [rng.randint(1, hi) for _ in range(200 - len(fixed))]


def run_matmul(k: Any, m: int, view: str | None, B: Any) -> tuple[tuple, Any]:
    import torch
    K = B.shape[0]
    if view == "transposed":
        A = (torch.randn(K, m, device="cuda", dtype=torch.float16) / 8).t()
        C = torch.empty(B.shape[1], m, device="cuda", dtype=torch.float16).t()
    elif view == "misaligned":
        A = (torch.randn(m * K + 1, device="cuda", dtype=torch.float16) / 8)[1:].view(m, K)
        C = torch.empty(m * B.shape[1] + 1, device="cuda", dtype=torch.float16)[1:].view(
            m, B.shape[1])
    else:
        A = torch.randn(m, K, device="cuda", dtype=torch.float16) / 8
        C = torch.empty(m, B.shape[1], device="cuda", dtype=torch.float16)
    return (A, B, C), lambda: torch.allclose(C.float(), A.float() @ B.float(), rtol=2e-2,
                                              atol=5e-2)


def run_add(k: Any, n: int, view: str | None) -> tuple[tuple, Any]:
    import torch
    if view == "transposed":  # a strided view: every other element
        X = torch.randn(2 * n, device="cuda")[::2]
        Y = torch.randn(2 * n, device="cuda")[::2]
    elif view == "misaligned":
        X = torch.randn(n + 1, device="cuda")[1:]
        Y = torch.randn(n + 1, device="cuda")[1:]
    else:
        X, Y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    OUT = torch.empty(n, device="cuda")
    return (X, Y, OUT), lambda: torch.allclose(OUT, X + Y)


def run_rows(k: Any, r: int, view: str | None) -> tuple[tuple, Any]:
    import torch
    cols = 4096
    if view == "transposed":
        X = torch.randn(cols, r, device="cuda", dtype=torch.float16).t()
    elif view == "misaligned":
        X = torch.randn(r * cols + 1, device="cuda", dtype=torch.float16)[1:].view(r, cols)
    else:
        X = torch.randn(r, cols, device="cuda", dtype=torch.float16)
    OUT = torch.empty(r, cols, device="cuda", dtype=torch.float16)
    ref = X.float() - X.float().mean(dim=1, keepdim=True)
    return (X, OUT), lambda: torch.allclose(OUT.float(), ref, rtol=1e-2, atol=1e-2)


def serve_child(workdir: Path) -> int:
    import torch

    from ctbuild import runtime
    hide_tileiras()
    import cov_kernels.kernels as kk
    runtime.configure(cache_dir=workdir / "cache", mode="strict")
    rng = random.Random(2026)
    B = torch.randn(4096, 4096, device="cuda", dtype=torch.float16) / 8
    runners = {"dyn_matmul": lambda k, n, v: run_matmul(k, n, v, B), "dyn_add": run_add,
               "dyn_center_rows": run_rows}
    his = {"dyn_matmul": 8192, "dyn_add": 1 << 24, "dyn_center_rows": 8192}
    served: dict[str, Any] = {}
    for name in KERNELS:
        k = getattr(kk, name)
        calls = [(n, None) for n in sizes_for(his[name], rng)]
        calls += [(rng.randint(1, min(his[name], 8192)), ("misaligned", "transposed")[i % 2])
                  for i in range(20)]
        wrong, errors = [], []
        for n, view in calls:
            args, ok = runners[name](k, n, view)
            try:
                k(*args)
                torch.cuda.synchronize()
                if not ok():
                    wrong.append((n, view))
            except Exception as exc:  # noqa: BLE001 - reported as a failed call
                errors.append(f"{n} {view}: {type(exc).__name__}: {str(exc)[:200]}")
        prov = k.runtime.provenance()
        served[name] = prov["entries"]
        check(not wrong and not errors, f"{name}: {len(calls)} calls correct",
              f"{len(wrong)} wrong {wrong[:5]}, {len(errors)} errors {errors[:3]}")
        check(prov["misses"] == {} or not any(prov["misses"].values()),
              f"{name}: 0 misses", json.dumps(prov["misses"]))
        print(f"     {name}: launches {prov['launches']}, served by class "
              f"{json.dumps(prov['classes'])}, config from {json.dumps(prov['origins'])}")
    # A persistent kernel whose grid uses dev.sm_count.
    k = kk.persistent_scale
    bad = []
    for n in [1, 17, 4095, 1 << 20, (1 << 24) - 3] + [rng.randint(1, 1 << 24) for _ in range(35)]:
        X = torch.randn(n, device="cuda")
        OUT = torch.empty(n, device="cuda")
        k(X, OUT)
        torch.cuda.synchronize()
        if not torch.allclose(OUT, 2 * X):
            bad.append(n)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    grids = sorted({tuple(e.grid) for e in k.runtime._entries})
    check(not bad and all(g[0] <= sms * 2 for g in grids),
          "persistent_scale: 40 sizes correct, grid <= sm_count * occupancy",
          f"sm_count {sms}, grids {grids[-3:]}, wrong {bad[:5]}")
    served["persistent_scale"] = k.runtime.provenance()["entries"]
    stats = runtime.stats()
    check(COMPILES[0] == 0 and stats["jit_compiles"] == 0,
          "no compile at serve time", f"compile_tile calls {COMPILES[0]}, stats {stats}")
    # Relaxed CUBIN at M=4095 vs exact CUBIN at M=4096, interleaved round by round (this GPU's
    # clock drifts by ~15% over seconds: one block of samples per size would time the drift).
    mm = kk.dyn_matmul
    runs = {}
    for m in (4096, 4095):
        (A, B2, C), _ = run_matmul(mm, m, None, B)
        mm(A, B2, C)
        runs[m] = (A, B2, C)
        e = mm.explain(A, B2, C)
        meta = _planned_class(workdir, e["compile_key"])
        print(f"     M={m}: CUBIN {e['compile_key'][:12]} (served as {e['cubin_class']}, "
              f"planned as {meta}), config {e['config']}")
    start, end = torch.cuda.Event(True), torch.cuda.Event(True)
    samples: dict[int, list[float]] = {4096: [], 4095: []}
    for rnd in range(40):
        for m in ((4096, 4095) if rnd % 2 == 0 else (4095, 4096)):
            start.record()
            for _ in range(10):
                mm(*runs[m])
            end.record()
            end.synchronize()
            samples[m].append(start.elapsed_time(end) * 100)  # us per launch
    ratio = statistics.median(b / a for a, b in zip(samples[4096], samples[4095]))
    times = {m: statistics.median(v) for m, v in samples.items()}
    check(ratio <= 1.05, "relaxed CUBIN at M=4095 within 5% of exact at M=4096",
          f"median {times[4095]:.1f} us vs {times[4096]:.1f} us, median paired ratio "
          f"{ratio:.3f}x over 40 interleaved rounds on {torch.cuda.get_device_name()}")
    (workdir / "served.json").write_text(json.dumps({
        "gpu": torch.cuda.get_device_name(), "served": served}, default=str))
    return 1 if FAILED else 0


def _planned_class(workdir: Path, key: str) -> str:
    from ctbuild.cache import Store
    for k, meta in Store(workdir / "cache").compile_entries():
        if k == key:
            return str(meta.get("class", "exact"))
    return "?"


def explain_child(workdir: Path) -> int:
    """CPU only: explain every layout the GPU run served and compare."""
    import cov_kernels.kernels as kk

    from ctbuild import runtime
    from ctbuild.specs import Workload, spec_from_json
    runtime.configure(cache_dir=workdir / "cache", mode="strict")
    data = json.loads((workdir / "served.json").read_text())
    agree = total = calls = 0
    bad = []
    for name, entries in data["served"].items():
        k = getattr(kk, name)
        for e in entries:
            w = Workload({p: spec_from_json(v) for p, v in e["workload"].items()})
            x = k.explain(**w, arch=e["arch"], gpu=data["gpu"])
            total += 1
            calls += e["launches"]
            same = (x["cubin_class"], x["compile_key"], x["config"]) == \
                (e["cubin_class"], e["compile_key"], e["config"])
            agree += same
            if not same:
                bad.append((name, e["workload"], (x["cubin_class"], x["config"]),
                            (e["cubin_class"], e["config"])))
    return 0 if check(agree == total and total > 0,
                      "explain on CPU agrees with what the GPU served",
                      f"{agree}/{total} layouts ({calls} calls); first disagreements "
                      f"{bad[:3]}") else 1


def loop_child(workdir: Path, phase: str) -> int:
    import torch

    from ctbuild import runtime
    hide_tileiras()
    import cov_kernels.kernels as kk
    mode = "default" if phase == "first" else "strict"
    runtime.configure(cache_dir=workdir / "cache", mode=mode,
                      record=workdir / "misses.jsonl" if phase == "first" else None)
    k = kk.dyn_matmul
    A = torch.randn(3000, 1000, device="cuda", dtype=torch.float16) / 8
    B = torch.randn(1000, 4096, device="cuda", dtype=torch.float16) / 8
    C = torch.empty(3000, 4096, device="cuda", dtype=torch.float16)
    try:
        k(A, B, C)
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001
        return 0 if check(False, f"loop {phase}: call served", f"{type(exc).__name__}: {exc}") \
            else 1
    ok = torch.allclose(C.float(), A.float() @ B.float(), rtol=2e-2, atol=5e-2)
    e = k.runtime.provenance()["entries"][-1]
    if phase == "first":
        recorded = (workdir / "misses.jsonl").read_text() if \
            (workdir / "misses.jsonl").exists() else ""
        check(ok and COMPILES[0] == 0 and "dyn_matmul" in recorded,
              "loop: unseen workload served without a compiler and recorded",
              f"class {e['cubin_class']}, config from {e['config_from']}, "
              f"compiles {COMPILES[0]}, record lines {len(recorded.splitlines())}")
    else:
        check(ok and e["cubin_class"] == "exact" and e["config_from"] == "cache" and
              COMPILES[0] == 0, "loop: strict hit after precompile --from-record and tune",
              f"class {e['cubin_class']}, config from {e['config_from']}, misses "
              f"{runtime.stats()['misses']}")
    return 1 if FAILED else 0


# ---- the driver ----------------------------------------------------------------------------
def stage_build(workdir: Path) -> None:
    cache = str(workdir / "cache")
    p = ctbuild("precompile", "--config", str(CONFIG), "--cache", cache, "--arch", "sm_90")
    check(p.returncode == 0, "precompile the coverage project")
    p = ctbuild("tune", "--config", str(CONFIG), "--cache", cache)
    check(p.returncode == 0, "tune every bucket")


def stage_serve(workdir: Path) -> None:
    check(child("serve", workdir) == 0, "serve stage (fresh strict process, no tileiras)")
    check(child("explain", workdir, gpu=False) == 0, "explain stage (CPU only)")


def stage_loop(workdir: Path) -> None:
    cache = str(workdir / "cache")
    (workdir / "misses.jsonl").unlink(missing_ok=True)
    if child("loop", workdir, "--phase", "first") != 0:
        check(False, "loop: first sight")
        return
    p = ctbuild("precompile", "--config", str(CONFIG), "--cache", cache, "--arch", "sm_90",
                "--from-record", str(workdir / "misses.jsonl"))
    check(p.returncode == 0, "loop: precompile --from-record")
    p = ctbuild("tune", "--config", str(CONFIG), "--cache", cache, "--kernel", "dyn_matmul")
    check(p.returncode == 0 and "3000" in p.stdout, "loop: tune picks up the recorded workload")
    check(child("loop", workdir, "--phase", "second") == 0, "loop: fresh strict process")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/ctbuild-coverage-check"))
    parser.add_argument("--stage", choices=("build", "serve", "loop", "all"), default="all")
    parser.add_argument("--child", choices=("serve", "explain", "loop"))
    parser.add_argument("--phase", choices=("first", "second"), default="first")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.child == "serve":
        return serve_child(args.workdir)
    if args.child == "explain":
        return explain_child(args.workdir)
    if args.child == "loop":
        return loop_child(args.workdir, args.phase)
    stages = {"build": stage_build, "serve": stage_serve, "loop": stage_loop}
    for name in (stages if args.stage == "all" else [args.stage]):
        stages[name](args.workdir)
    print(f"\n{'FAIL' if FAILED else 'PASS'} coverage check: "
          f"{len(FAILED)} failed check(s) {FAILED}")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
