"""Flash-attention forward (online softmax over key blocks): the slowest kind of compile."""
import cuda.tile as ct

import ctbuild
from ctbuild import Product, Tensor


def _fits(cfg, w, arch) -> bool:
    return w.Q.shape[1] >= cfg.BM and w.K.shape[1] >= cfg.BN


def _workload(bh: int, seq: int, dim: int, dtype: str) -> dict:
    t = Tensor((bh, seq, dim), dtype)
    return {"Q": t, "K": t, "V": t, "O": t}


@ctbuild.autotune(
    space=Product(BM=[64, 128], BN=[32, 64, 128], occupancy=[1, 2], where=_fits),
    grid=lambda cfg, w: (w.Q.shape[0], ct.cdiv(w.Q.shape[1], cfg.BM)),
    args=lambda cfg, w: (w.Q, w.K, w.V, w.O, w.Q.shape[2], cfg.BM, cfg.BN),
    default={"BM": 128, "BN": 64, "occupancy": 1},
    workloads=[_workload(32, 4096, 128, "float16"), _workload(64, 2048, 64, "bfloat16"),
               _workload(16, 8192, 128, "bfloat16")],
)
@ct.kernel
# Q, K, V, O: attention's usual names; workloads and args= name the parameters, so O stays O.
def attention(Q, K, V, O, D: ct.Constant[int], BM: ct.Constant[int], BN: ct.Constant[int]):  # noqa: E741
    bh, m = ct.bid(0), ct.bid(1)
    q = ct.reshape(ct.load(Q, index=(bh, m, 0), shape=(1, BM, D),
                           padding_mode=ct.PaddingMode.ZERO), (BM, D))
    m_i = ct.full((BM, 1), -1.0e30, ct.float32)
    l_i = ct.zeros((BM, 1), ct.float32)
    acc = ct.zeros((BM, D), ct.float32)
    k_tiles = K.tiled_view((1, BN, D), padding_mode=ct.PaddingMode.ZERO)
    v_tiles = V.tiled_view((1, BN, D), padding_mode=ct.PaddingMode.ZERO)
    for j in range(k_tiles.num_tiles(1)):
        k = ct.reshape(k_tiles.load((bh, j, 0)), (BN, D))
        s = ct.mma(q, ct.transpose(k), ct.zeros((BM, BN), ct.float32)) * 0.125
        m_new = ct.maximum(m_i, ct.max(s, axis=1, keepdims=True))
        p = ct.exp(s - m_new)
        alpha = ct.exp(m_i - m_new)
        l_i = l_i * alpha + ct.sum(p, axis=1, keepdims=True)
        v = ct.reshape(v_tiles.load((bh, j, 0)), (BN, D))
        acc = ct.mma(p.astype(Q.dtype), v, acc * alpha)
        m_i = m_new
    out = acc / l_i
    ct.store(O, index=(bh, m, 0), tile=ct.reshape(out, (1, BM, D)).astype(O.dtype))
