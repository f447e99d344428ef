"""Elementwise SiLU-and-multiply: only the occupancy hint and the tile width vary."""
import cuda.tile as ct

import ctbuild
from ctbuild import Product, Tensor


@ctbuild.autotune(
    space=Product(TILE=[512, 1024, 2048], occupancy=[1, 2, 4, 8]),
    grid=lambda cfg, w: (ct.cdiv(w.X.shape[0], cfg.TILE),),
    default={"TILE": 1024, "occupancy": 2},
    workloads=[
        {"X": Tensor((1 << 20,), "float16"), "Y": Tensor((1 << 20,), "float16"),
         "OUT": Tensor((1 << 20,), "float16")},
        {"X": Tensor((1 << 24,), "bfloat16"), "Y": Tensor((1 << 24,), "bfloat16"),
         "OUT": Tensor((1 << 24,), "bfloat16")},
    ],
)
@ct.kernel
def silu_mul(X, Y, OUT, TILE: ct.Constant[int]):
    bid = ct.bid(0)
    x = ct.load(X, index=(bid,), shape=(TILE,), padding_mode=ct.PaddingMode.ZERO).astype(ct.float32)
    y = ct.load(Y, index=(bid,), shape=(TILE,), padding_mode=ct.PaddingMode.ZERO).astype(ct.float32)
    out = x / (1.0 + ct.exp(-x)) * y
    ct.store(OUT, index=(bid,), tile=out.astype(OUT.dtype))
