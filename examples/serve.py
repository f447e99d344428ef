"""A service-like process that starts warm from the ctbuild cache.

    CTBUILD_CACHE_DIR=/cache [CTBUILD_MODE=strict] python examples/serve.py [--requests 100]

Imports the example kernels, then serves "requests": each kernel on its first declared workload,
first call timed separately (that is where a cold service would compile and tune), then steady
calls. Prints, per kernel, where its launches came from (cache hit / tuned online / default /
JIT), the config it runs, the first-call and steady times, and a correctness check against torch.
Nothing here compiles or tunes when the cache is warm.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

T0 = time.perf_counter()
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from demo_kernels.dynamic import softmax_rows, transpose  # noqa: E402
from demo_kernels.elementwise import silu_mul  # noqa: E402
from demo_kernels.matmul import matmul  # noqa: E402
from demo_kernels.rmsnorm import rmsnorm  # noqa: E402
from demo_kernels.rope import rope_inplace  # noqa: E402

import ctbuild  # noqa: E402
from ctbuild import runtime  # noqa: E402

IMPORT_S = time.perf_counter() - T0


def inputs(kernel: ctbuild.TunedKernel) -> tuple:
    """Random arguments for the kernel's first declared workload."""
    out = []
    for spec in kernel.workloads[0].values():
        if isinstance(spec, ctbuild.Tensor):
            out.append(torch.randn(spec.shape, device="cuda").to(getattr(torch, spec.dtype)))
        elif isinstance(spec, ctbuild.Scalar):
            out.append(spec.value())
        else:
            out.append(spec)
    return tuple(out)


#: (rtol, atol) where the default (2e-2, 5e-2) would pass anything: softmax probabilities are
#: about 1e-3 here, and a transpose moves bits.
TOLERANCE = {"softmax_rows": (2e-2, 1e-4), "transpose": (0.0, 0.0)}


def expected(kernel: ctbuild.TunedKernel, a: tuple) -> tuple[int, torch.Tensor]:
    """(output argument index, torch result) -- computed before the kernel runs."""
    if kernel is silu_mul:
        return 2, torch.nn.functional.silu(a[0].float()) * a[1].float()
    if kernel is rmsnorm:
        x = a[0].float()
        return 2, x * torch.rsqrt((x * x).mean(1, keepdim=True) + a[3]) * a[1].float()
    if kernel is matmul:
        return 2, a[0].float() @ a[1].float()
    if kernel is softmax_rows:
        return 1, torch.softmax(a[0].float(), dim=1)
    if kernel is transpose:
        return 1, a[0].float().t()
    half = a[0].shape[2] // 2
    x1, x2 = a[0][..., :half].float(), a[0][..., half:].float()
    c, s = a[1][:, None, :], a[2][:, None, :]
    return 0, torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100, help="steady calls per kernel")
    parser.add_argument("--json", help="also write the report here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("serve.py needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.zeros(1, device="cuda")
    ctx = runtime.context()
    print(f"ctbuild serve: {torch.cuda.get_device_name()}, cache {ctx.cache_dir} "
          f"({'read-only' if not ctx.writable else 'writable'}), mode {ctx.mode}, "
          f"toolchain {(ctx.toolchain_fp or 'none')[:12]}, imports {IMPORT_S:.2f} s")
    report = {}
    header = (f"{'kernel':14} {'origin':8} {'first ms':>9} {'steady us':>10} {'ok':>3}  "
              "config (config from / cubin from)")
    print(header)
    for kernel in (silu_mul, rmsnorm, matmul, rope_inplace, softmax_rows, transpose):
        a = inputs(kernel)
        idx, want = expected(kernel, a)
        torch.cuda.synchronize()
        t = time.perf_counter()
        kernel(*a)
        torch.cuda.synchronize()
        first_ms = (time.perf_counter() - t) * 1e3
        rtol, atol = TOLERANCE.get(kernel.name, (2e-2, 5e-2))
        ok = torch.allclose(a[idx].float(), want, rtol=rtol, atol=atol)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.requests):
            kernel(*a)
        end.record()
        torch.cuda.synchronize()
        steady_us = start.elapsed_time(end) * 1e3 / max(args.requests, 1)
        prov = kernel.runtime.provenance()
        e = prov["entries"][0]
        origin = max(prov["origins"], key=prov["origins"].get)
        print(f"{kernel.name:14} {origin:8} {first_ms:9.2f} {steady_us:10.1f} "
              f"{'yes' if ok else 'NO':>3}  {json.dumps(e['config'])} "
              f"({e['config_from']} / {e['cubin_from']})")
        report[kernel.name] = {"first_ms": first_ms, "steady_us": steady_us, "correct": bool(ok),
                               "provenance": prov}
    stats = runtime.stats()
    print(f"stats: {json.dumps(stats)}; total {time.perf_counter() - T0:.2f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"kernels": report, "stats": stats}, indent=2,
                                              default=str))
    return 0 if all(r["correct"] for r in report.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
