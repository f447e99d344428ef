"""Tune one workload online (``CTBUILD_MODE=tune``): measure the candidates on this GPU.

Uses ``ct.tune.exhaustive_search`` over the kernel's pruned, capped candidates for this arch,
launching the runtime's own `ServedKernel` per config (CUBINs from the cache, JIT on a miss).
Arguments declared ``restore`` are snapshot once and restored before every sample and at the
end; ``reset_to_zero`` ones are zeroed before every sample.
"""
from __future__ import annotations

from typing import Any, Callable

from .arch import Arch
from .space import Config
from .specs import Workload


def tune_workload(tuned: Any, w: Workload, arch: str, stream: Any,
                  served: Callable[[Config], Any]) -> tuple[Config, dict[str, Any]]:
    """Measure every candidate of ``w`` on ``arch``; returns (winner, measurement summary)."""
    import cuda.tile as ct

    candidates = tuned.candidates(w, Arch(arch)).kept
    snapshots = {name: w[name].clone() for name in tuned.restore}
    zero = [w[name] for name in tuned.reset_to_zero]

    def args_fn(cfg: Config) -> tuple:
        for name, snap in snapshots.items():
            w[name].copy_(snap)
        for t in zero:
            t.zero_()
        return tuned.kernel_args(cfg, w)

    try:
        result = ct.tune.exhaustive_search(
            candidates, stream, lambda cfg: tuned.grid(cfg, w), served, args_fn, quiet=True)
    finally:
        for name, snap in snapshots.items():
            w[name].copy_(snap)
    best = result.best
    return Config(best.config, tuned.name), {
        "mean_us": best.mean_us, "error_margin_us": best.error_margin_us,
        "candidates": len(candidates), "measured": len(result.successes),
        "failures": [[dict(c), t.__name__, m.splitlines()[0] if m else ""]
                     for c, t, m in result.failures][:10]}
