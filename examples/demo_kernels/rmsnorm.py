"""RMSNorm over the last dim: one row per block, the whole row in one tile (a reduction)."""
import cuda.tile as ct

import ctbuild
from ctbuild import Configs, Scalar, Tensor

EPS_MIN = 1e-12


def _row_width(w) -> int:
    return ctbuild.pow2(w.X.shape[1])


@ctbuild.autotune(
    # The tile must cover the row; only occupancy and warps are worth searching.
    space=Configs([{"occupancy": o, "num_worker_warps": n} for o in (1, 2, 4) for n in (4, 8)]),
    grid=lambda cfg, w: (w.X.shape[0],),
    args=lambda cfg, w: (w.X, w.W, w.OUT, w.eps, _row_width(w)),
    default={"occupancy": 2, "num_worker_warps": 4},
    workloads=[
        {"X": Tensor((4096, 4096), "float16"), "W": Tensor((4096,), "float16"),
         "OUT": Tensor((4096, 4096), "float16"), "eps": Scalar("float32", 1e-6)},
        {"X": Tensor((8192, 2048), "bfloat16"), "W": Tensor((2048,), "bfloat16"),
         "OUT": Tensor((8192, 2048), "bfloat16"), "eps": Scalar("float32", 1e-6)},
    ],
)
@ct.kernel
def rmsnorm(X, W, OUT, eps, N: ct.Constant[int]):
    row = ct.bid(0)
    x = ct.load(X, index=(row, 0), shape=(1, N), padding_mode=ct.PaddingMode.ZERO)
    x = x.astype(ct.float32)
    w = ct.load(W, index=(0,), shape=(N,), padding_mode=ct.PaddingMode.ZERO).astype(ct.float32)
    mean_sq = ct.sum(x * x, axis=1, keepdims=True) / X.shape[1]
    y = x * ct.rsqrt(mean_sq + ct.maximum(eps, EPS_MIN)) * ct.reshape(w, (1, N))
    ct.store(OUT, index=(row, 0), tile=y.astype(OUT.dtype))
