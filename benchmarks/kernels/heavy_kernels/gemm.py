"""Matmul variants: a fused GEMM + bias + SiLU epilogue and a batched GEMM."""
import cuda.tile as ct

import ctbuild
from ctbuild import Product, Tensor


def _fits(cfg, w, arch) -> bool:
    smem = 2 * (cfg.TM * cfg.TK + cfg.TK * cfg.TN) * 2
    return smem <= 200 * 1024


@ctbuild.autotune(
    space=Product(TM=[64, 128, 256], TN=[64, 128, 256], TK=[32, 64], where=_fits),
    grid=lambda cfg, w: (ct.cdiv(w.A.shape[0], cfg.TM), ct.cdiv(w.B.shape[1], cfg.TN)),
    default={"TM": 128, "TN": 128, "TK": 64},
    workloads=[
        {"A": Tensor((8192, 4096), "float16"), "B": Tensor((4096, 11008), "float16"),
         "BIAS": Tensor((11008,), "float16"), "C": Tensor((8192, 11008), "float16")},
        {"A": Tensor((4096, 4096), "bfloat16"), "B": Tensor((4096, 14336), "bfloat16"),
         "BIAS": Tensor((14336,), "bfloat16"), "C": Tensor((4096, 14336), "bfloat16")},
    ],
)
@ct.kernel
def gemm_bias_silu(A, B, BIAS, C, TM: ct.Constant[int], TN: ct.Constant[int],
                   TK: ct.Constant[int]):
    i, j = ct.bid(0), ct.bid(1)
    a_tiles = A.tiled_view((TM, TK), padding_mode=ct.PaddingMode.ZERO)
    b_tiles = B.tiled_view((TK, TN), padding_mode=ct.PaddingMode.ZERO)
    acc = ct.zeros((TM, TN), ct.float32)
    for k in range(a_tiles.num_tiles(1)):
        acc = ct.mma(a_tiles.load((i, k)), b_tiles.load((k, j)), acc)
    bias = ct.load(BIAS, index=(j,), shape=(TN,), padding_mode=ct.PaddingMode.ZERO)
    acc = acc + ct.reshape(bias.astype(ct.float32), (1, TN))
    acc = acc / (1.0 + ct.exp(-acc))
    ct.store(C, index=(i, j), tile=acc.astype(C.dtype))


@ctbuild.autotune(
    space=Product(TM=[64, 128], TN=[64, 128, 256], TK=[32, 64], where=_fits),
    grid=lambda cfg, w: (w.A.shape[0], ct.cdiv(w.A.shape[1], cfg.TM),
                         ct.cdiv(w.B.shape[2], cfg.TN)),
    default={"TM": 128, "TN": 128, "TK": 64},
    workloads=[
        {"A": Tensor((16, 2048, 1024), "bfloat16"), "B": Tensor((16, 1024, 2048), "bfloat16"),
         "C": Tensor((16, 2048, 2048), "bfloat16")},
    ],
)
@ct.kernel
def batched_gemm(A, B, C, TM: ct.Constant[int], TN: ct.Constant[int], TK: ct.Constant[int]):
    b, i, j = ct.bid(0), ct.bid(1), ct.bid(2)
    a_tiles = A.tiled_view((1, TM, TK), padding_mode=ct.PaddingMode.ZERO)
    b_tiles = B.tiled_view((1, TK, TN), padding_mode=ct.PaddingMode.ZERO)
    acc = ct.zeros((TM, TN), ct.float32)
    for k in range(a_tiles.num_tiles(2)):
        a = ct.reshape(a_tiles.load((b, i, k)), (TM, TK))
        w = ct.reshape(b_tiles.load((b, k, j)), (TK, TN))
        acc = ct.mma(a, w, acc)
    ct.store(C, index=(b, i, j), tile=ct.reshape(acc, (1, TM, TN)).astype(C.dtype))
