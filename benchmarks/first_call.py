"""A warm first call against the floor: ms from a call to its synchronized result, in fresh
processes with byte-compiled sources.

    python benchmarks/first_call.py --cache DIR [--repeat 3] [--kernel NAME ...] [--json PATH]

DIR is a tuned cache of the example kernels for this GPU (``benchmarks/warm_start.py --cache
DIR`` builds one). The sources are byte-compiled first (``python -m compileall``), as an
installed package has them. Then, per example kernel, each figure is the median over
``--repeat`` fresh processes (``CTBUILD_MODE=strict``; the CUDA context, the inputs and their
torch reference are made before the clock starts, and a torch kernel has run, as in a server
that has loaded its model: a context's very first kernel launch costs a few ms of its own;
``import cuda.tile`` and then ``import ctbuild`` are timed on their own):

  first      the first call of the first served kernel of the process
  later      its first call after another kernel's (a later new CUBIN: the runtime is warm)
  first+pre  / later+pre: the same with ``CTBUILD_PRELOAD=1``, the preload waited for
  floor      the same CUBIN loaded and launched through the driver API (ctypes on libcuda:
             cuModuleLoadData, cuModuleGetFunction, cuLaunchKernel, cuCtxSynchronize), with
             the kernel's arguments packed at the offsets cuFuncGetParamInfo gives: the
             process's first module load, which costs the driver ~4 ms more than a later one
  floor2     the same after another kernel's CUBIN went that way (a later module load)

and each figure's ratio to its floor (first: floor; later: floor2). Every result is checked
against torch.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for p in (str(ROOT), str(ROOT / "tests"), str(ROOT / "examples")):
    if p not in sys.path:
        sys.path.insert(0, p)

SCENARIOS = ("first", "later", "first+pre", "later+pre", "floor", "floor2")
#: The floor each scenario is compared with: a first call with the process's first module
#: load, a later one with a later module load (the driver's first costs ~4 ms more).
FLOOR_OF = {"first": "floor", "first+pre": "floor", "floor": "floor", "later": "floor2",
            "later+pre": "floor2", "floor2": "floor2"}


# ---- in a fresh process ----------------------------------------------------------------------
def child(scenario: str, name: str) -> dict[str, Any]:
    """One measurement: see the module doc."""
    import torch
    torch.cuda.init()
    torch.ones(1, device="cuda").add_(1)  # a kernel run: the context is as a server's is
    torch.cuda.synchronize()  # the CUDA context exists (and has run a kernel) from here
    t = time.perf_counter()
    import cuda.tile  # noqa: F401 - every cuTile program imports it, with or without ctbuild
    cutile_ms = (time.perf_counter() - t) * 1e3
    t = time.perf_counter()
    import ctbuild  # noqa: F401
    import_ms = (time.perf_counter() - t) * 1e3
    import gpu_runtime_examples as ex
    kernels = ex.load_examples()
    if scenario.endswith("+pre"):
        from ctbuild import runtime
        job = runtime.preloading()
        assert job is not None, "CTBUILD_PRELOAD=1 started no preload"
        job.wait()
    if scenario.startswith("later"):
        other = next(k for n, k in kernels.items() if n != name)
        args, _ = ex.gpu_case(other)
        other(*args)
        torch.cuda.synchronize()
    if scenario == "floor2":  # another kernel's CUBIN through the driver first
        floor(next(k for n, k in kernels.items() if n != name))
    if scenario.startswith("floor"):
        ms, ok = floor(kernels[name])
        return {"ms": ms, "ok": ok, "import_ms": import_ms, "cutile_ms": cutile_ms}
    tuned = kernels[name]
    args, expected = ex.gpu_case(tuned)
    torch.cuda.synchronize()
    t = time.perf_counter()
    tuned(*args)
    host = time.perf_counter()
    torch.cuda.synchronize()
    done = time.perf_counter()
    ex.check(name, args, expected)
    return {"ms": (done - t) * 1e3, "host_ms": (host - t) * 1e3, "ok": True,
            "import_ms": import_ms, "cutile_ms": cutile_ms}


def floor(tuned: Any) -> tuple[float | None, bool]:
    """(ms to the synchronized result of the served CUBIN through the driver API, correct)."""
    import gpu_runtime_examples as ex
    import torch

    from ctbuild.cache import Store
    from ctbuild.cutile import constant_params
    args, expected = ex.gpu_case(tuned)
    res = tuned.runtime.resolve(args)
    hit = Store(os.environ["CTBUILD_CACHE_DIR"], readonly=True).get_compile(res.compile_key)
    if hit is None:
        return None, False
    consts = constant_params(tuned.kernel)
    values = [v for p, v in zip(tuned.kernel_params, res.kernel_args) if p not in consts]
    cuda = ctypes.CDLL("libcuda.so.1")
    torch.cuda.synchronize()
    t = time.perf_counter()
    module, func = ctypes.c_void_p(), ctypes.c_void_p()
    _ok(cuda.cuModuleLoadData(ctypes.byref(module), hit.cubin), "cuModuleLoadData")
    _ok(cuda.cuModuleGetFunction(ctypes.byref(func), module, hit.symbol.encode()),
        "cuModuleGetFunction")
    buf = _params(cuda, func, values)
    threads = ctypes.c_int()
    _ok(cuda.cuFuncGetAttribute(ctypes.byref(threads), 0, func), "cuFuncGetAttribute")
    size = ctypes.c_size_t(len(buf))
    extra = (ctypes.c_void_p * 5)(1, ctypes.cast(buf, ctypes.c_void_p), 2,
                                  ctypes.cast(ctypes.pointer(size), ctypes.c_void_p), 0)
    grid = tuple(res.grid) + (1,) * (3 - len(res.grid))
    # cuTile does not export the block size it launches a CUBIN with: the CUBIN's most threads
    # per block first, then the common sizes; the first the driver accepts is the kernel's.
    for block in dict.fromkeys((threads.value, 128, 256, 384, 512, 64, 32)):
        status = cuda.cuLaunchKernel(func, *[ctypes.c_uint(g) for g in grid], block, 1, 1, 0,
                                     ctypes.c_void_p(torch.cuda.current_stream().cuda_stream),
                                     None, extra)
        if status != 1:  # CUDA_ERROR_INVALID_VALUE: not this block size
            break
    _ok(status, "cuLaunchKernel")
    _ok(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
    ms = (time.perf_counter() - t) * 1e3
    try:
        ex.check(tuned.name, args, expected)
        return ms, True
    except AssertionError:
        return ms, False


def _params(cuda: Any, func: Any, values: list) -> Any:
    """The kernel's parameter buffer: per tensor its pointer, sizes and strides, per scalar
    its value, each at the offset and of the size the CUBIN declares (a mismatch raises)."""
    import struct

    import torch
    flat: list[tuple[str, Any]] = []
    for v in values:
        if isinstance(v, torch.Tensor):
            flat += [("ptr", v.data_ptr())] + [("idx", s) for s in v.shape] + \
                [("idx", s) for s in v.stride()]
        elif isinstance(v, bool):
            flat.append(("i32", int(v)))
        elif isinstance(v, int):
            flat.append(("i32", v))
        else:
            flat.append(("f32", float(v)))
    layout = []
    for i in range(len(flat) + 1):
        off, size = ctypes.c_size_t(), ctypes.c_size_t()
        if cuda.cuFuncGetParamInfo(func, ctypes.c_size_t(i), ctypes.byref(off),
                                   ctypes.byref(size)) != 0:
            break
        layout.append((off.value, size.value))
    if len(layout) != len(flat):
        raise RuntimeError(f"the CUBIN has {len(layout)} parameters, expected {len(flat)}")
    end = max(o + s for o, s in layout)
    buf = ctypes.create_string_buffer(end)
    for (kind, v), (off, size) in zip(flat, layout):
        fmt = {("ptr", 8): "<Q", ("idx", 4): "<i", ("idx", 8): "<q", ("i32", 4): "<i",
               ("f32", 4): "<f"}.get((kind, size))
        if fmt is None:
            raise RuntimeError(f"parameter of kind {kind} has size {size}")
        struct.pack_into(fmt, buf, off, v)
    return buf


def _ok(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what} failed with CUresult {status}")


# ---- the driver ------------------------------------------------------------------------------
def measure(cache: str, name: str, scenario: str) -> dict[str, Any]:
    env = {**os.environ, "CTBUILD_CACHE_DIR": cache, "CTBUILD_MODE": "strict"}
    env.pop("CTBUILD_PRELOAD", None)
    if scenario.endswith("+pre"):
        env["CTBUILD_PRELOAD"] = "1"
    out = subprocess.run([sys.executable, __file__, "--child", scenario, "--kernel", name],
                         capture_output=True, text=True, env=env, timeout=300)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        return {"ms": None, "ok": False, "error": (out.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(lines[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", default=os.environ.get("CTBUILD_CACHE_DIR"))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json")
    parser.add_argument("--child", choices=SCENARIOS, help=argparse.SUPPRESS)
    parser.add_argument("--kernel", action="append",
                        help="only this example kernel (repeatable; default: every example)")
    args = parser.parse_args()
    if args.child:
        try:
            result = child(args.child, args.kernel[0])
        except Exception as exc:  # noqa: BLE001 - reported as this figure's error
            result = {"ms": None, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(result))
        return 0
    if not args.cache:
        parser.error("give --cache or CTBUILD_CACHE_DIR (a tuned cache: benchmarks/warm_start.py)")
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "ctbuild"),
                    str(ROOT / "cache"), str(ROOT / "examples"), str(ROOT / "tests")],
                   check=True, capture_output=True)
    import gpu_runtime_examples as ex
    import torch
    device = torch.cuda.get_device_name()
    rows: dict[str, dict[str, Any]] = {}
    print(f"first call on {device}: ms from the call to its synchronized result, median of "
          f"{args.repeat} fresh byte-compiled processes (x: ratio to its floor)")
    print(f"{'kernel':14}" + "".join(f"{s:>17}" for s in SCENARIOS) + f"{'import':>9}"
          f"{'cuda.tile':>10}")
    for name in args.kernel or ex.NAMES:
        runs = {s: [measure(args.cache, name, s) for _ in range(args.repeat)] for s in SCENARIOS}
        row: dict[str, Any] = {}
        for s, results in runs.items():
            times = [r["ms"] for r in results if r.get("ms") is not None]
            row[s] = {"ms": statistics.median(times) if times else None,
                      "ok": all(r.get("ok") for r in results),
                      "errors": sorted({r["error"] for r in results if "error" in r})}
        for what in ("import_ms", "cutile_ms"):
            seen = [r[what] for rs in runs.values() for r in rs if what in r]
            row[what] = statistics.median(seen) if seen else None
        for s in SCENARIOS:
            ms, base = row[s]["ms"], row[FLOOR_OF[s]]["ms"]
            row[s]["ratio"] = ms / base if ms is not None and base else None
        rows[name] = row
        print(f"{name:14}" + "".join(_cell(row[s]) for s in SCENARIOS) +
              f"{_num(row['import_ms']):>9}{_num(row['cutile_ms']):>10}")
        for s in SCENARIOS:
            for e in row[s]["errors"]:
                print(f"  {s}: {e}")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device, "repeat": args.repeat,
                                               "kernels": rows}, indent=2))
    return 0 if all(r[s]["ok"] for r in rows.values() for s in SCENARIOS
                    if not s.startswith("floor")) else 1


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _cell(fig: dict[str, Any]) -> str:
    ratio = "" if fig["ratio"] is None else f" ({fig['ratio']:.1f}x)"
    mark = "" if fig["ok"] else "!"
    return f"{_num(fig['ms']) + mark + ratio:>17}"


if __name__ == "__main__":
    raise SystemExit(main())
