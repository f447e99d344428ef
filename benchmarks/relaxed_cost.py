"""What a relaxed CUBIN costs, separated from what an odd size costs (needs a GPU and tileiras).

The serving-coverage check compares the relaxed CUBIN at M=4095 with the exact CUBIN at
M=4096; that mixes two effects: the CUBIN's weaker assumptions and the odd size itself (a
partial last tile). This script compiles the exact and the relaxed CUBIN of one matmul config
(the coverage fixture's ``dyn_matmul``, 4096x4096 B, fp16) and times, in one process:

* exact CUBIN at M=4096, relaxed CUBIN at M=4096 (the cost of the class alone),
* relaxed CUBIN at M=4095 (what serving an odd M costs), and cuTile's own JIT at M=4095
  (what a service without ctbuild would run for that size).

    python benchmarks/relaxed_cost.py [--arch sm_90]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ROOT / "tests" / "fixtures" / "coverage_project"
CONFIG = {"TM": 128, "TN": 128, "TK": 64}


def fixed_kernel(tuned: Any, cfg: Any, cubin: bytes, symbol: str) -> Any:
    """A ``ct.kernel`` that launches one given CUBIN whatever the call's signature."""
    import cuda.tile as ct

    class Fixed(ct.kernel):
        def __new__(cls) -> Fixed:
            return ct.kernel.__new__(cls, tuned.pyfunc)

        def __init__(self) -> None:
            o = tuned.compiler_options(cfg)
            super().__init__(tuned.pyfunc, num_ctas=o.num_ctas, occupancy=o.occupancy,
                             opt_level=o.opt_level, num_worker_warps=o.num_worker_warps)

        def _compile(self, signature: Any, context: Any, compute_capability: Any = None
                     ) -> tuple:
            return cubin, symbol, None, ()

    return Fixed()


def time_us(launch: Any) -> float:
    """Median microseconds per launch over 30 samples of 10 launches (CUDA events)."""
    import torch
    launch()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(True), torch.cuda.Event(True)
    samples = []
    for _ in range(30):
        start.record()
        for _ in range(10):
            launch()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 100)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default=None, help="default: the GPU's")
    args = parser.parse_args()
    import cuda.tile as ct
    import torch
    sys.path[:0] = [str(ROOT), str(PROJECT)]
    from cov_kernels.kernels import dyn_matmul as tuned

    from ctbuild.arch import Arch
    from ctbuild.build.compiler import compile_job
    from ctbuild.build.plan import job_for, relaxed_weakening
    from ctbuild.signature_classes import EXACT_WEAKENING
    from ctbuild.space import Config
    from ctbuild.toolchain import probe

    arch = args.arch or str(Arch.from_capability(*torch.cuda.get_device_capability()))
    cfg = Config(CONFIG, tuned.name)
    rep = next(w for w in tuned.workloads if w.A.shape[0] == 4096)
    tc = probe().fingerprint
    built = {}
    for name, weakening in (("exact", EXACT_WEAKENING),
                            ("relaxed", relaxed_weakening(tuned, cfg, rep))):
        out = compile_job(job_for(tuned, cfg, rep, arch, tc, weakening).to_json())
        built[name] = fixed_kernel(tuned, cfg, out["cubin"], out["symbol"])

    K = 4096
    B = torch.randn(K, K, device="cuda", dtype=torch.float16) / 8

    def runner(kernel: Any, m: int) -> Any:
        A = torch.randn(m, K, device="cuda", dtype=torch.float16) / 8
        C = torch.empty(m, K, device="cuda", dtype=torch.float16)
        w = tuned.bind(A, B, C)
        grid, kargs = tuned.grid(cfg, w), tuned.kernel_args(cfg, w)
        stream = torch.cuda.current_stream()

        def launch() -> None:
            ct.launch(stream, grid, kernel, kargs)
        launch()
        torch.cuda.synchronize()
        assert torch.allclose(C.float(), A.float() @ B.float(), rtol=2e-2, atol=5e-2), \
            f"wrong result at M={m}"
        return launch

    rows = [("exact CUBIN, M=4096", time_us(runner(built["exact"], 4096))),
            ("relaxed CUBIN, M=4096", time_us(runner(built["relaxed"], 4096))),
            ("relaxed CUBIN, M=4095", time_us(runner(built["relaxed"], 4095))),
            ("cuTile JIT, M=4095", time_us(runner(tuned.kernel, 4095)))]
    base = rows[0][1]
    print(f"dyn_matmul {CONFIG} on {torch.cuda.get_device_name()} ({arch}), B 4096x4096 fp16")
    for label, us in rows:
        print(f"  {label:24} {us:8.1f} us  {us / base:5.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
