"""Kernels whose compile cost hides in their code rather than their tile sizes, in the shapes of
TileGym's: a paged split-KV decode (a loop over pages gathered through an integer block table;
tiles of 16 x 128, the most TileIR here), a LayerNorm looping over a row in chunks (its row
length is a constant, no tile), and an FP8 group quantisation (tiny tiles).
`benchmarks/first_build.py` measures how well a first build's estimates rank them."""
import cuda.tile as ct

import ctbuild
from ctbuild import Product, Tensor


def _decode_workload(batch: int, kv_heads: int, group: int, dim: int, pages: int, page: int,
                     dtype: str) -> dict:
    return {"Q": Tensor((batch, kv_heads * group, dim), dtype),
            "K_CACHE": Tensor((pages, page, kv_heads, dim), dtype),
            "V_CACHE": Tensor((pages, page, kv_heads, dim), dtype),
            "BLOCK_TABLE": Tensor((batch, 256), "int32"),
            "SEQ_LENS": Tensor((batch,), "int32"),
            "O_PART": Tensor((batch, kv_heads * group, 8, dim), "float32"),
            "LSE_PART": Tensor((batch, kv_heads * group, 8), "float32")}


@ctbuild.autotune(
    space=Product(SPLITS=[4, 8], occupancy=[1, 2]),
    grid=lambda cfg, w: (w.Q.shape[0], w.K_CACHE.shape[2], cfg.SPLITS),
    args=lambda cfg, w: (w.Q, w.K_CACHE, w.V_CACHE, w.BLOCK_TABLE, w.SEQ_LENS, w.O_PART,
                         w.LSE_PART, w.Q.shape[2], w.K_CACHE.shape[1],
                         w.Q.shape[1] // w.K_CACHE.shape[2], cfg.SPLITS),
    default={"SPLITS": 8, "occupancy": 1},
    workloads=[_decode_workload(32, 8, 4, 128, 4096, 16, "bfloat16")],
    # contexts of up to 256 pages of 16 tokens, through any of the cache's 4096 pages: by the
    # default rule for integers the lengths would be 1..7 tokens (empty contexts)
    inputs={"SEQ_LENS": (1, 256 * 16), "BLOCK_TABLE": (0, 4095)},
)
@ct.kernel
def paged_decode(Q, K_CACHE, V_CACHE, BLOCK_TABLE, SEQ_LENS, O_PART, LSE_PART,
                 D: ct.Constant[int], PAGE: ct.Constant[int], GROUP: ct.Constant[int],
                 SPLITS: ct.Constant[int]):
    """Split ``split`` of sequence ``b``'s pages for the ``GROUP`` query heads of KV head
    ``kvh``: partial output and log-sum-exp, combined by another kernel."""
    b, kvh, split = ct.bid(0), ct.bid(1), ct.bid(2)
    seq_len = ct.gather(SEQ_LENS, b)
    pages = (seq_len + PAGE - 1) // PAGE
    per_split = (pages + SPLITS - 1) // SPLITS
    first = split * per_split
    q = ct.load(Q, index=(b, kvh, 0), shape=(1, GROUP, D)).reshape((GROUP, D))
    m_i = ct.full((GROUP, 1), -1.0e30, ct.float32)
    l_i = ct.zeros((GROUP, 1), ct.float32)
    acc = ct.zeros((GROUP, D), ct.float32)
    rows = ct.arange(PAGE, dtype=ct.int32)
    cols = ct.arange(D, dtype=ct.int32)
    for p in range(first, ct.minimum(first + per_split, pages)):
        page = ct.gather(BLOCK_TABLE, (b, p))
        k = ct.gather(K_CACHE, (page, rows[:, None], kvh, cols[None, :]))
        v = ct.gather(V_CACHE, (page, rows[:, None], kvh, cols[None, :]))
        s = ct.mma(q, ct.transpose(k), ct.zeros((GROUP, PAGE), ct.float32)) * 0.088
        s = ct.where(p * PAGE + rows[None, :] < seq_len, s, -1.0e30)
        m_new = ct.maximum(m_i, ct.max(s, axis=1, keepdims=True))
        e = ct.exp(s - m_new)
        alpha = ct.exp(m_i - m_new)
        l_i = l_i * alpha + ct.sum(e, axis=1, keepdims=True)
        acc = ct.mma(e.astype(Q.dtype), v, acc * alpha)
        m_i = m_new
    ct.store(O_PART, index=(b, kvh, split, 0), tile=(acc / l_i).reshape((1, GROUP, 1, D)))
    ct.store(LSE_PART, index=(b, kvh, split), tile=(m_i + ct.log(l_i)).reshape((1, GROUP, 1)))


@ctbuild.autotune(
    space=Product(TILE_N=[256, 512, 1024, 2048], occupancy=[1, 2]),
    grid=lambda cfg, w: (w.X.shape[0],),
    args=lambda cfg, w: (w.X, w.W, w.B, w.Y, w.X.shape[1], cfg.TILE_N),
    default={"TILE_N": 1024, "occupancy": 1},
    workloads=[{"X": Tensor((8192, 4096), dt), "W": Tensor((4096,), dt),
                "B": Tensor((4096,), dt), "Y": Tensor((8192, 4096), dt)}
               for dt in ("float16", "bfloat16")],
)
@ct.kernel
def layer_norm(X, W, B, Y, N: ct.Constant[int], TILE_N: ct.Constant[int]):
    """One row per block, in chunks of TILE_N: mean, variance, then the normalised row."""
    row = ct.bid(0)
    tiles = ct.cdiv(N, TILE_N)
    acc = ct.zeros((1, TILE_N), ct.float32)
    for j in range(tiles):
        acc += ct.load(X, index=(row, j), shape=(1, TILE_N),
                       padding_mode=ct.PaddingMode.ZERO).astype(ct.float32)
    mean = ct.sum(acc, axis=1, keepdims=True) / N
    var = ct.zeros((1, TILE_N), ct.float32)
    for j in range(tiles):
        x = ct.load(X, index=(row, j), shape=(1, TILE_N),
                    padding_mode=ct.PaddingMode.ZERO).astype(ct.float32)
        cols = j * TILE_N + ct.arange(TILE_N, dtype=ct.int32)
        d = ct.where(cols[None, :] < N, x - mean, 0.0)
        var += d * d
    rstd = ct.rsqrt(ct.sum(var, axis=1, keepdims=True) / N + 1e-5)
    for j in range(tiles):
        x = ct.load(X, index=(row, j), shape=(1, TILE_N),
                    padding_mode=ct.PaddingMode.ZERO).astype(ct.float32)
        w = ct.load(W, index=(j,), shape=(TILE_N,), padding_mode=ct.PaddingMode.ZERO)
        b = ct.load(B, index=(j,), shape=(TILE_N,), padding_mode=ct.PaddingMode.ZERO)
        y = (x - mean) * rstd * w.astype(ct.float32)[None, :] + b.astype(ct.float32)[None, :]
        ct.store(Y, index=(row, j), tile=y.astype(Y.dtype))


@ctbuild.autotune(
    space=Product(ROWS=[1, 2, 4, 8], occupancy=[1, 2]),
    grid=lambda cfg, w: (ct.cdiv(w.X.shape[0], cfg.ROWS), w.X.shape[1] // 128),
    args=lambda cfg, w: (w.X, w.Q, w.S, cfg.ROWS, 128),
    default={"ROWS": 1, "occupancy": 1},
    workloads=[{"X": Tensor((8192, 7168), "bfloat16"),
                "Q": Tensor((8192, 7168), "float8_e4m3fn"), "S": Tensor((8192, 56), "float32")}],
)
@ct.kernel
def fp8_group_quant(X, Q, S, ROWS: ct.Constant[int], GROUP: ct.Constant[int]):
    """Q = X / scale in FP8 e4m3, one scale per GROUP columns of each row."""
    r, g = ct.bid(0), ct.bid(1)
    x = ct.load(X, index=(r, g), shape=(ROWS, GROUP), padding_mode=ct.PaddingMode.ZERO)
    x = x.astype(ct.float32)
    amax = ct.maximum(ct.max(ct.abs(x), axis=1, keepdims=True), 1e-10)
    scale = amax / 448.0
    q = ct.minimum(ct.maximum(x / scale, -448.0), 448.0)
    ct.store(Q, index=(r, g), tile=q.astype(Q.dtype))
    ct.store(S, index=(r, g), tile=scale)
