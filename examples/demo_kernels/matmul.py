"""Tiled matmul C = A @ B with a tile-size search and an arch-dependent constraint."""
import cuda.tile as ct

import ctbuild
from ctbuild import Product, Tensor, Zip

#: Shared memory per block the tiles may use, by arch family (bytes, leaving headroom).
SMEM_BUDGET = {90: 200 * 1024, 100: 200 * 1024}


def fits(cfg, w, arch) -> bool:
    """Reject tiles whose double-buffered A and B tiles overflow shared memory, and 2-CTA
    clusters before Blackwell (sm_100), where num_ctas > 1 does not pay."""
    elem = 2  # fp16 / bf16
    smem = 2 * (cfg.TM * cfg.TK + cfg.TK * cfg.TN) * elem
    if smem > SMEM_BUDGET.get(arch.cc, 160 * 1024):
        return False
    if cfg.num_ctas > 1 and arch.cc < 100:
        return False
    return w.A.shape[0] >= cfg.TM and w.B.shape[1] >= cfg.TN


@ctbuild.autotune(
    space=Product(Zip(TM=[64, 128, 128, 256], TN=[64, 128, 256, 128]), TK=[32, 64],
                  num_ctas=[1, 2], where=fits),
    grid=lambda cfg, w: (ct.cdiv(w.A.shape[0], cfg.TM), ct.cdiv(w.B.shape[1], cfg.TN)),
    default={"TM": 128, "TN": 128, "TK": 64, "num_ctas": 1},
    key=ctbuild.key(bucket={"A": {0: ctbuild.pow2}, "C": {0: ctbuild.pow2}}),
    workloads=[
        {"A": Tensor((4096, 4096), "float16"), "B": Tensor((4096, 4096), "float16"),
         "C": Tensor((4096, 4096), "float16")},
        {"A": Tensor((1024, 8192), "bfloat16"), "B": Tensor((8192, 1024), "bfloat16"),
         "C": Tensor((1024, 1024), "bfloat16")},
    ],
)
@ct.kernel
def matmul(A, B, C, TM: ct.Constant[int], TN: ct.Constant[int], TK: ct.Constant[int]):
    i, j = ct.bid(0), ct.bid(1)
    a_tiles = A.tiled_view((TM, TK), padding_mode=ct.PaddingMode.ZERO)
    b_tiles = B.tiled_view((TK, TN), padding_mode=ct.PaddingMode.ZERO)
    acc = ct.zeros((TM, TN), ct.float32)
    for k in range(a_tiles.num_tiles(1)):
        acc = ct.mma(a_tiles.load((i, k)), b_tiles.load((k, j)), acc)
    ct.store(C, index=(i, j), tile=acc.astype(C.dtype))
