"""Rotary position embedding applied in place to Q (a RoPE-style in-place kernel).

Tuning runs the kernel many times; ``restore=("Q",)`` makes the tuner snapshot Q once and
restore it before every sample, so Q ends up as after one clean run.
"""
import cuda.tile as ct

import ctbuild
from ctbuild import Product, Tensor


@ctbuild.autotune(
    space=Product(TOKENS=[16, 32, 64], occupancy=[1, 2, 4]),
    grid=lambda cfg, w: (ct.cdiv(w.Q.shape[0], cfg.TOKENS), w.Q.shape[1]),
    args=lambda cfg, w: (w.Q, w.COS, w.SIN, cfg.TOKENS, w.Q.shape[2] // 2),
    default={"TOKENS": 32, "occupancy": 2},
    restore=("Q",),
    workloads=[
        {"Q": Tensor((4096, 32, 128), "float16"), "COS": Tensor((4096, 64), "float32"),
         "SIN": Tensor((4096, 64), "float32")},
    ],
)
@ct.kernel
def rope_inplace(Q, COS, SIN, TOKENS: ct.Constant[int], HALF: ct.Constant[int]):
    t, h = ct.bid(0), ct.bid(1)
    x1 = ct.load(Q, index=(t, h, 0), shape=(TOKENS, 1, HALF), padding_mode=ct.PaddingMode.ZERO)
    x2 = ct.load(Q, index=(t, h, 1), shape=(TOKENS, 1, HALF), padding_mode=ct.PaddingMode.ZERO)
    c = ct.reshape(ct.load(COS, index=(t, 0), shape=(TOKENS, HALF)), (TOKENS, 1, HALF))
    s = ct.reshape(ct.load(SIN, index=(t, 0), shape=(TOKENS, HALF)), (TOKENS, 1, HALF))
    a, b = x1.astype(ct.float32), x2.astype(ct.float32)
    ct.store(Q, index=(t, h, 0), tile=(a * c - b * s).astype(Q.dtype))
    ct.store(Q, index=(t, h, 1), tile=(b * c + a * s).astype(Q.dtype))
