"""The heavy kernels declared over `Dim`s as a user serving many sizes would: attention over
batch x heads (``BH``) and sequence length (``S``), the fused GEMM over its token count (``M``),
at most three buckets per Dim. `benchmarks/bucket_regret.py` and the tune benchmarks measure
how well one winner per bucket serves every size in it."""
import cuda.tile as ct

import ctbuild
from ctbuild import Dim, Product, Tensor

from .attention import attention
from .gemm import _fits, gemm_bias_silu

BH = Dim("BH", 1, 16, buckets=[2, 16])
S = Dim("S", 16, 4096, buckets=[256, 1024, 4096])
M = Dim("M", 1, 8192, buckets=[128, 1024, 8192])

_seq = Tensor((BH, S, 64), "float16")
attention_dims = ctbuild.autotune(
    space=Product(BM=[64, 128], BN=[32, 64, 128], occupancy=[1, 2]),
    grid=lambda cfg, w: (w.Q.shape[0], ct.cdiv(w.Q.shape[1], cfg.BM)),
    args=lambda cfg, w: (w.Q, w.K, w.V, w.O, w.Q.shape[2], cfg.BM, cfg.BN),
    default={"BM": 128, "BN": 64, "occupancy": 1},
    workloads=[{"Q": _seq, "K": _seq, "V": _seq, "O": _seq}],
    name="attention_dims",
)(attention.kernel)

gemm_dims = ctbuild.autotune(
    space=Product(TM=[64, 128, 256], TN=[64, 128, 256], TK=[32, 64], where=_fits),
    grid=lambda cfg, w: (ct.cdiv(w.A.shape[0], cfg.TM), ct.cdiv(w.B.shape[1], cfg.TN)),
    default={"TM": 128, "TN": 128, "TK": 64},
    workloads=[{"A": Tensor((M, 4096), "float16"), "B": Tensor((4096, 4096), "float16"),
                "BIAS": Tensor((4096,), "float16"), "C": Tensor((M, 4096), "float16")}],
    name="gemm_dims",
)(gemm_bias_silu.kernel)
