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


def time_interleaved(launches: dict[str, Any], rounds: int = 40) -> dict[str, list[float]]:
    """Microseconds per launch, one sample of 10 launches per variant and round, the variants
    interleaved (and their order rotated) round by round: a GPU's clock drifts by ~15% over
    seconds, so timing one variant after another would compare clock states, not CUBINs."""
    import torch
    for launch in launches.values():
        launch()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(True), torch.cuda.Event(True)
    names = list(launches)
    out: dict[str, list[float]] = {n: [] for n in names}
    for rnd in range(rounds):
        for name in names[rnd % len(names):] + names[:rnd % len(names)]:
            start.record()
            for _ in range(10):
                launches[name]()
            end.record()
            end.synchronize()
            out[name].append(start.elapsed_time(end) * 100)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default=None, help="default: the GPU's")
    args = parser.parse_args()
    import cuda.tile as ct
    import torch
    sys.path[:0] = [str(ROOT), str(PROJECT)]
    from cov_kernels.kernels import dyn_matmul as tuned

    from ctbuild.arch import Arch
    from ctbuild.compile.compiler import compile_job
    from ctbuild.compile.plan import job_for, relaxed_weakening
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

    samples = time_interleaved({
        "exact CUBIN, M=4096": runner(built["exact"], 4096),
        "relaxed CUBIN, M=4096": runner(built["relaxed"], 4096),
        "relaxed CUBIN, M=4095": runner(built["relaxed"], 4095),
        "cuTile JIT, M=4095": runner(tuned.kernel, 4095)})
    base = samples["exact CUBIN, M=4096"]
    print(f"dyn_matmul {CONFIG} on {torch.cuda.get_device_name()} ({arch}), B 4096x4096 fp16; "
          "median of 40 interleaved rounds, ratio = median of per-round ratios to exact")
    for label, us in samples.items():
        ratio = statistics.median(x / b for x, b in zip(us, base))
        print(f"  {label:24} {statistics.median(us):8.1f} us  {ratio:5.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
