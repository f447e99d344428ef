"""Which sizes inside a `Dim` bucket a tune races besides its upper bound (`span_sizes`).

Along each Dim: its lower bound, powers of two in between and the size one above each (where a
power-of-two tile goes from filled exactly to almost half empty), geometric midpoints (on
multiples of 16, the other layout class), and below the upper bound the midpoint of a wide gap
and the size one below a bound that is a multiple of 16 (another layout class); with several
Dims every combination of those points (a grid). `ctbuild.tune.span` chooses a bucket's
winners, and where it splits, from the times at these sizes.
"""
from __future__ import annotations

import itertools
import math

from ..dims import Bucket

#: The most sizes below its upper bound raced along one Dim of a bucket over one Dim, and
#: over several (each of its Dims, whose points then form a grid).
MAX_PER_DIM = (7, 4)
#: The most sizes of a grid over a bucket's Dims (more Dims race their lines alone).
MAX_GRID = 64


def dim_points(lo: int, hi: int, most: int = MAX_PER_DIM[0]) -> list[int]:
    """The sizes below ``hi`` to race along one Dim: its lower bound; powers of two in between
    and the size one above each, where a power-of-two tile goes from filled exactly to almost
    half empty (at most ``(most - 1) // 2`` of them, spread on a log scale); then geometric
    midpoints of the widest gaps, up to ``most`` sizes; and the midpoint of the gap below
    ``hi`` where it is still wider than 1.5x, and where ``hi`` is a multiple of 16 the size
    one below it. A split's top sub-bucket starts above a raced size: without a size inside
    that gap it is served by a winner chosen at ``hi`` alone (one noisy size picked it for
    half the bucket: `benchmarks/tune_reproducibility.py`), and without one of another
    layout class (`ctbuild.bucket_map.layout_class`: another CUBIN) by a winner chosen on
    aligned sizes alone (attention over ``BH x S`` served S=201 120% slower than the best
    config there: `benchmarks/bucket_regret.py --measure`)."""
    ks = [k for k in range(hi.bit_length()) if lo < 2 ** k < hi]
    n = (most - 1) // 2
    if len(ks) > n:  # spread on the log scale above the lower bound, the largest kept
        ks = sorted({ks[round((i + 1) * (len(ks) - 1) / n)] for i in range(n)})
    if lo >= hi:
        return []
    pts = {lo} | {p for k in ks for p in (2 ** k, 2 ** k + 1) if p < hi}
    while len(pts) < most:
        edges = sorted({*pts, hi})
        gap, a, b = max((math.log(b / a), a, b) for a, b in zip(edges, edges[1:]))
        mid = _midpoint(a, b)
        if gap <= math.log(1.25) or not a < mid < b:
            break
        pts.add(mid)
    below = max(pts)
    if hi / below > 1.5 and below < _midpoint(below, hi) < hi:
        pts.add(_midpoint(below, hi))
    if hi % 16 == 0 and hi - 1 > max(pts):
        pts.add(hi - 1)
    return sorted(pts)


def _midpoint(a: int, b: int) -> int:
    """The geometric midpoint of ``a`` and ``b``, on a multiple of 16 where one lies between
    them: the sizes one above a power of two, and one below a top, are of the other layout
    class, so each part of a split has sizes of both (attention's S in 513..725, raced at 513
    and 725 alone, served S=592, a multiple of 16, 45% slower than the best config there:
    `benchmarks/bucket_regret.py --measure`)."""
    mid = math.sqrt(a * b)
    aligned = 16 * round(mid / 16)
    return aligned if a < aligned < b else round(mid)


def span_sizes(bucket: Bucket) -> list[dict[str, int]]:
    """The sizes to race inside ``bucket`` other than its upper bound: along each Dim
    (`dim_points`, the others at their upper bound); with several Dims every combination of
    those points (a grid, where it has at most `MAX_GRID` sizes; else the all-lower corner and
    the point where every Dim is at the middle of its points); no size twice. A bucket over
    several Dims needs the grid: its best config changes with each Dim (the number of blocks
    against the SMs), and a sub-bucket cut along one Dim is only served well along the other
    where sizes off the lines through the upper corner were raced (on the lines alone,
    attention over ``BH x S`` served drawn sizes with p95 63% and max 125% loss,
    `benchmarks/bucket_regret.py --measure`)."""
    top = dict(bucket.sizes)
    low = bucket.lower_bounds()
    most = MAX_PER_DIM[0] if len(top) == 1 else MAX_PER_DIM[1]
    points = {name: dim_points(low[name], top[name], most) for name in top}
    out: list[dict[str, int]] = []
    for name in sorted(top):
        out += [{**top, name: p} for p in points[name]]
    if len(top) > 1 and math.prod(len(p) + 1 for p in points.values()) <= MAX_GRID:
        names = sorted(top)
        out += [dict(zip(names, combo)) for combo in itertools.product(
            *([*points[n], top[n]] for n in names))]
    elif len(top) > 1:
        middle = {n: pts[len(pts) // 2] if pts else top[n] for n, pts in points.items()}
        out += [dict(low), middle]
    return [s for i, s in enumerate(out) if s != top and s not in out[:i]]
