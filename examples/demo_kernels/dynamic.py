"""Shapes decided at call time: a row softmax over a `Dim` row count, and a persistent transpose
whose grid is sized by the GPU it runs on (``grid(cfg, w, dev)``)."""
import cuda.tile as ct

import ctbuild
from ctbuild import Dim, Product, Tensor

#: The batch's row count varies per call. Coarse buckets keep the build small: each bucket is
#: tuned once, at its upper bound, and every row count up to it shares that winner.
ROWS = Dim("ROWS", 1, 8192, buckets=(64, 1024, 8192))
#: The row width is fixed, so the whole row fits one tile (no constant depends on ROWS).
COLS = 1024


@ctbuild.autotune(
    space=Product(BLOCK_ROWS=[1, 2, 4]),
    grid=lambda cfg, w: (ct.cdiv(w.X.shape[0], cfg.BLOCK_ROWS),),
    args=lambda cfg, w: (w.X, w.OUT, cfg.BLOCK_ROWS, w.X.shape[1]),
    default={"BLOCK_ROWS": 1},
    workloads=[{"X": Tensor((ROWS, COLS), "float16"), "OUT": Tensor((ROWS, COLS), "float16")}],
)
@ct.kernel
def softmax_rows(X, OUT, BLOCK_ROWS: ct.Constant[int], WIDTH: ct.Constant[int]):
    """OUT = softmax(X, axis=1): BLOCK_ROWS whole rows per block, in float32."""
    blk = ct.bid(0)
    x = ct.load(X, index=(blk, 0), shape=(BLOCK_ROWS, WIDTH), padding_mode=ct.PaddingMode.ZERO)
    x = x.astype(ct.float32)
    e = ct.exp(x - ct.max(x, axis=1, keepdims=True))
    y = e / ct.sum(e, axis=1, keepdims=True)
    ct.store(OUT, index=(blk, 0), tile=y.astype(OUT.dtype))


def persistent_grid(cfg, w, dev):
    """One wave: at most ``sm_count * occupancy`` blocks, each looping over the tiles (the
    nominal device of the arch at plan time, the real GPU at tune and run time)."""
    tiles = ct.cdiv(w.X.shape[0], cfg.TILE) * ct.cdiv(w.X.shape[1], cfg.TILE)
    return (max(1, min(dev.sm_count * cfg.occupancy, tiles)),)


@ctbuild.autotune(
    # Two blocks per SM; only the tile size is searched (tileiras gives the same CUBIN for
    # occupancy 1 and 2 here, so that axis would only change the grid).
    space=Product(TILE=[32, 64, 128], occupancy=[2]),
    grid=persistent_grid,
    default={"TILE": 64, "occupancy": 2},
    workloads=[{"X": Tensor((4096, 2048), "float16"), "OUT": Tensor((2048, 4096), "float16")}],
)
@ct.kernel
def transpose(X, OUT, TILE: ct.Constant[int]):
    """OUT = X.T: block b transposes tiles b, b + num_blocks, ... of X (a grid-stride loop)."""
    tiles_n = ct.cdiv(X.shape[1], TILE)
    tiles = ct.cdiv(X.shape[0], TILE) * tiles_n
    for t in range(ct.bid(0), tiles, ct.num_blocks(0)):
        i, j = t // tiles_n, t % tiles_n
        x = ct.load(X, index=(i, j), shape=(TILE, TILE), padding_mode=ct.PaddingMode.ZERO)
        ct.store(OUT, index=(j, i), tile=ct.transpose(x))
