"""Shared by the runtime tests and benchmarks: the example kernels, their inputs and torch
references, and building a warm cache in-process (precompile in a local process pool -- no Ray
-- then tune on this GPU).

Importable without a GPU (the CPU tests use `load_examples` and `host_tensors`).
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
MODULES = ("demo_kernels.elementwise", "demo_kernels.rmsnorm", "demo_kernels.matmul",
           "demo_kernels.rope", "demo_kernels.dynamic")
NAMES = ("silu_mul", "rmsnorm", "matmul", "rope_inplace", "softmax_rows", "transpose")
#: Sizes of each `Dim` kernel's dims that are NOT bucket bounds: no build or tuning was made
#: for them; the bucket above's tuning record and the CUBINs precompiled for the range serve them.
BETWEEN_BUCKETS = {"softmax_rows": {"ROWS": 1000}}
ARCH = "sm_90"


def load_examples() -> dict[str, Any]:
    """name -> TunedKernel of the example kernels (a `Dim` kernel's ``workloads`` are the
    representatives of its buckets, so code that iterates them covers every bucket)."""
    import importlib
    for p in (str(ROOT), str(EXAMPLES)):
        if p not in sys.path:
            sys.path.insert(0, p)
    for m in MODULES:
        importlib.import_module(m)
    from ctbuild import registered
    found = {k.name: k for k in registered() if k.module in MODULES}
    return {n: found[n] for n in NAMES}


# ---- real inputs and references -----------------------------------------------------------
def torch_dtype(name: str) -> Any:
    import torch
    return getattr(torch, name)


def host_tensors(w: Any, device: str = "cpu", seed: int = 0, values: bool = True) -> tuple:
    """Real arguments (positional, in the kernel's call order) for a spec workload.

    ``values=False``: the same tensors with their memory left as allocated, for callers whose
    launch is stubbed and reads no value (filling a 4096 x 4096 matrix with random values takes
    a large part of a second)."""
    import torch

    from ctbuild import Scalar, Tensor
    g = torch.Generator(device="cpu").manual_seed(seed)
    out = []
    for v in w.values():
        if isinstance(v, Tensor):
            t = torch.empty_strided(v.shape, v.strides, dtype=torch.float32)
            if values:
                t.copy_(torch.rand(v.shape, generator=g) * 2 - 1)
            out.append(t.to(device=device, dtype=torch_dtype(v.dtype)))
        elif isinstance(v, Scalar):
            out.append(v.value())
        else:
            out.append(v)
    return tuple(out)


def reference(name: str, args: tuple) -> tuple[int, Any]:
    """(index of the output argument, expected value) computed with torch from the inputs
    (call this before the kernel runs: rope_inplace overwrites its input)."""
    import torch
    if name == "silu_mul":
        x, y, out = args
        return 2, (torch.nn.functional.silu(x.float()) * y.float()).to(out.dtype)
    if name == "rmsnorm":
        x, w, out, eps = args
        xf = x.float()
        y = xf * torch.rsqrt((xf * xf).mean(dim=1, keepdim=True) + max(eps, 1e-12)) * w.float()
        return 2, y.to(out.dtype)
    if name == "matmul":
        a, b, c = args
        return 2, (a.float() @ b.float()).to(c.dtype)
    if name == "rope_inplace":
        q, cos, sin = args
        half = q.shape[2] // 2
        x1, x2 = q[..., :half].float(), q[..., half:].float()
        c, s = cos[:, None, :], sin[:, None, :]
        return 0, torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(q.dtype)
    if name == "softmax_rows":
        x, out = args
        return 1, torch.softmax(x.float(), dim=1).to(out.dtype)
    if name == "transpose":
        x, out = args
        return 1, x.t().contiguous()
    raise KeyError(name)


#: (rtol, atol) per kernel; a transpose moves bits, so it must match exactly.
TOLERANCE = {"silu_mul": (2e-2, 2e-2), "rmsnorm": (2e-2, 2e-2), "matmul": (2e-2, 5e-2),
             "rope_inplace": (2e-2, 2e-2), "softmax_rows": (2e-2, 1e-4), "transpose": (0.0, 0.0)}


def check(name: str, args: tuple, expected: tuple[int, Any]) -> None:
    import torch
    idx, want = expected
    rtol, atol = TOLERANCE[name]
    torch.testing.assert_close(args[idx].float(), want.float(), rtol=rtol, atol=atol)


def gpu_case(tuned: Any, workload_index: int = 0, seed: int = 0) -> tuple[tuple, tuple[int, Any]]:
    args = host_tensors(tuned.workloads[workload_index], device="cuda", seed=seed)
    return args, reference(tuned.name, args)


def capture(tuned: Any, args: tuple, calls: int = 1) -> Any:
    """A ``torch.cuda.CUDAGraph`` of ``calls`` calls of ``tuned`` on ``args``, warmed on a side
    stream first, as torch asks."""
    import torch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        tuned(*args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            tuned(*args)
    return graph


def replay_checked(graph: Any, tuned: Any, static: tuple, seed: int) -> None:
    """Copy a new case's inputs into the captured tensors ``static``, replay ``graph`` and
    check the result against torch."""
    import torch
    fresh, expected = gpu_case(tuned, seed=seed)
    for dst, src in zip(static, fresh):
        if isinstance(dst, torch.Tensor):
            dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    check(tuned.name, static, expected)


def between_buckets_case(tuned: Any, seed: int = 0) -> tuple[tuple, tuple[int, Any]]:
    """Like `gpu_case`, for a `Dim` kernel at its `BETWEEN_BUCKETS` sizes (a call no bucket
    representative has: what serving traffic looks like)."""
    from ctbuild.dims import concretize
    w = concretize(tuned.dynamic_workloads[0], BETWEEN_BUCKETS[tuned.name])
    args = host_tensors(w, device="cuda", seed=seed)
    return args, reference(tuned.name, args)


# ---- building a warm cache in-process ------------------------------------------------------
def _compile_one(job: dict[str, Any]) -> dict[str, Any]:
    from ctbuild.compile.compiler import compile_job
    try:
        return {"key": job["key"], **compile_job(job)}
    except Exception as exc:  # noqa: BLE001 - reported per job
        return {"key": job["key"], "error": f"{type(exc).__name__}: {exc}"}


def precompile(store: Any, kernels: list, arch: str = ARCH, workers: int | None = None,
               log: Callable[[str], None] = print) -> dict[str, Any]:
    """Plan every kernel x declared workload for ``arch`` and compile the missing CUBINs in a
    local process pool (fork, or spawn once CUDA is initialised in this process)."""
    from ctbuild.arch import Arch
    from ctbuild.compile.plan import make_plan
    from ctbuild.toolchain import probe
    tc = probe()
    store.put_toolchain(tc.fingerprint, {**tc.profile, "created": time.time()})
    plan = make_plan(kernels, [Arch(arch)], tc.fingerprint)
    todo = [j for j in plan.jobs.values() if not store.has_compile(j.key)]
    start = time.perf_counter()
    errors = []
    n = workers or min(16, os.cpu_count() or 4)
    # fork only before CUDA starts here: a test module run after another that used the GPU
    # forked a CUDA process, and that pytest process crashed at exit
    torch = sys.modules.get("torch")
    ctx = mp.get_context("spawn" if torch is not None and torch.cuda.is_initialized()
                         else "fork")
    with ctx.Pool(n) as pool:
        for res in pool.imap_unordered(_compile_one, [j.to_json() for j in todo]):
            job = plan.jobs[res["key"]]
            if "error" in res:
                errors.append(f"{job.kernel} {job.config}: {res['error']}")
                continue
            # the compile's own meta: with the TileIR digest, without which tune's identity
            # check rebuilds the entry (it cannot tell what code the CUBIN came from)
            store.put_compile(job.key, res["cubin"], symbol=res["symbol"], meta=res["meta"])
    seconds = time.perf_counter() - start
    log(f"precompile: {len(plan.jobs)} jobs, {len(todo)} compiled in {seconds:.1f} s with "
        f"{n} processes, {len(errors)} errors")
    for e in errors[:5]:
        log("  " + e)
    return {"jobs": len(plan.jobs), "compiled": len(todo), "errors": errors,
            "seconds": seconds, "toolchain": tc.fingerprint}


def tune_all(store: Any, kernels: list, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Tune every declared workload on this GPU with ``ctbuild.tune.tuner.tune_workload``."""
    from ctbuild.tune import tuner as tuning
    start = time.perf_counter()
    done = []
    for k in kernels:
        for w in k.workloads:
            rec = tuning.tune_workload(k, w, store=store, timeout_s=None)
            done.append({"kernel": k.name, "config": rec.config, "mean_us": rec.mean_us,
                         "default_us": rec.default_mean_us, "failures": len(rec.failures)})
            log(f"tune: {k.name} {json.dumps(rec.config)} "
                f"{rec.mean_us or float('nan'):.1f} us "
                f"(default {rec.default_mean_us or float('nan'):.1f} us)")
    seconds = time.perf_counter() - start
    log(f"tune: {len(done)} workloads in {seconds:.1f} s")
    return {"records": done, "seconds": seconds}


def build_cache(path: str | Path, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Precompile + tune the examples into ``path`` (reuses what is there)."""
    from ctbuild.cache import Store
    kernels = list(load_examples().values())
    store = Store(path)
    pre = precompile(store, kernels, log=log)
    tuned = tune_all(store, kernels, log=log)
    return {"precompile": pre, "tune": tuned}


def warm_examples_cache(new_dir: Callable[[], Path]) -> Path:
    """The examples' warm cache a GPU test serves from: ``CTBUILD_TEST_CACHE`` where it names
    one, else one built (`build_cache`) under ``new_dir()`` (a minute or two)."""
    given = os.environ.get("CTBUILD_TEST_CACHE")
    if given and Path(given, "ctbuild-cache.json").exists():
        return Path(given)
    path = new_dir() / "cache"
    build_cache(path)
    return path


# ---- making tileiras unreachable -------------------------------------------------------------
def hide_tileiras() -> None:
    """Make cuTile unable to find tileiras in this process (PATH stripped, finder raising)."""
    import cuda.tile._compile as cc
    os.environ["PATH"] = os.pathsep.join(
        p for p in os.environ.get("PATH", "").split(os.pathsep)
        if p and not (Path(p) / "tileiras").exists())

    def no_compiler() -> Any:
        raise FileNotFoundError("tileiras is hidden in this process (--no-tileiras)")

    cc._find_compiler_bin = no_compiler


class CompileCount:
    """Counts in-process tileiras runs (``compile_tile`` calls) from now on."""

    def __init__(self) -> None:
        import cuda.tile._compile as cc
        self.calls = 0
        original = cc.compile_tile

        def counting(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return original(*args, **kwargs)

        cc.compile_tile = counting
