"""Refined `Dim` buckets: where ``ctbuild tune`` split a declared bucket, and which
sub-bucket a size maps to.

A declared bucket is tuned over its sizes (`ctbuild.tune.span`). Where no config is within the
tie band at all of them, ``ctbuild tune`` splits the bucket along one Dim, and the part the
bucket's own winner still serves may be split again along another: the sizes up to a *split
point* (in every Dim of the bucket), not served by an earlier one, form a sub-bucket, whose
winner is recorded under the point's own tuning key, like any other record. The split points
live in the declared bucket's tuning record (its ``refined`` field): so the map is keyed
exactly as records are (kernel fingerprint, tuning key, GPU arch and model, toolchain), travels
with bundles and cache images, is pruned with the record, and is found on the read the runtime
already makes for the bucket. A size maps to the first split point (in the record's order) it
does not exceed in any Dim, else to the declared bucket; a record without ``refined`` maps
every size as the declaration does.

The record comes from a cache that may be shared, so the entry is read defensively: plain JSON
only, at most `MAX_POINTS` points, each naming exactly the bucket's Dims with whole sizes inside
the bucket, below its upper bound in one Dim at least, none inside an earlier one (it would
serve nothing). Anything else is refused with its reason (`BucketMapError`); the runtime then
warns and serves the declared bucket. A record's winners per layout class (``by_class``) are
read as defensively (`class_winners`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .dims import Bucket
from .space import Config
from .waves import WaveTable, read_table

#: The most times a bucket may be split along one Dim (``--refine N``, ``max_splits=``).
MAX_SPLITS = 4
#: The most split points one bucket's record may hold: `MAX_SPLITS` along each of up to four
#: Dims.
MAX_POINTS = 4 * MAX_SPLITS
#: The format of the ``refined`` entry this ctbuild writes and reads.
REFINED_FORMAT = 1


class BucketMapError(ValueError):
    """A ``refined`` entry that is not one this ctbuild reads (the declared bucket serves)."""


@dataclass(frozen=True)
class Split:
    """One sub-bucket: its upper corner (the split point) and the regret that caused it."""
    point: tuple[tuple[str, int], ...]
    regret_pct: float | None = None

    @property
    def sizes(self) -> dict[str, int]:
        return dict(self.point)

    def sub_bucket(self, bucket: Bucket, earlier: Sequence[Split] = ()) -> Bucket:
        """The sub-bucket as a `Bucket` of the same declaration: its representative is the
        split point, where it is tuned; its smallest sizes are the bucket's, raised in a Dim
        to one above each ``earlier`` split that covers this one in every other Dim (the sizes
        that split serves first, where this sub-bucket's regret is not timed)."""
        low = bucket.lower_bounds()
        mine = self.sizes
        for e in earlier:
            cut = [n for n in mine if e.sizes[n] < mine[n]]
            if len(cut) == 1:
                low[cut[0]] = max(low[cut[0]], e.sizes[cut[0]] + 1)
        return Bucket(bucket.declared, self.point, tuple((n, low[n]) for n, _ in self.point))

    def holds(self, sizes: Mapping[str, int]) -> bool:
        return all(sizes[n] <= v for n, v in self.point)

    def to_json(self) -> dict[str, Any]:
        return {"sizes": self.sizes, "regret_pct": self.regret_pct}


def refined_json(splits: Sequence[Split], max_splits: int) -> dict[str, Any]:
    """The ``refined`` entry of a declared bucket's record."""
    return {"format": REFINED_FORMAT, "max_splits": max_splits,
            "splits": [s.to_json() for s in splits]}


def read_splits(raw: Any, bucket: Bucket) -> tuple[Split, ...]:
    """The split points of a record's ``refined`` entry for ``bucket`` (None: no map, ``()``);
    `BucketMapError` names what is wrong with any other entry."""
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise BucketMapError(f"expected an object, got {type(raw).__name__}")
    version = raw.get("format", REFINED_FORMAT)
    if type(version) is not int or version != REFINED_FORMAT:
        raise BucketMapError(f"format {str(version)[:20]} is not one this ctbuild reads "
                             f"({REFINED_FORMAT})")
    points = raw.get("splits")
    if not isinstance(points, list):
        raise BucketMapError("no list of splits")
    if len(points) > MAX_POINTS:
        raise BucketMapError(f"{len(points)} splits, more than the {MAX_POINTS} a bucket may have")
    out = tuple(_split(p, bucket) for p in points)
    for i, b in enumerate(out):
        for a in out[:i]:
            if a.holds(b.sizes):
                raise BucketMapError(f"split {b.sizes} lies inside the earlier split {a.sizes}: "
                                     "it would serve no size")
    return out


def _split(obj: Any, bucket: Bucket) -> Split:
    """One split point, checked against the bucket's Dims and bounds."""
    sizes = obj.get("sizes") if isinstance(obj, dict) else None
    top = dict(bucket.sizes)
    if not isinstance(sizes, dict) or set(sizes) != set(top):
        got = sorted(map(str, sizes))[:8] if isinstance(sizes, dict) else type(sizes).__name__
        raise BucketMapError(f"a split must give sizes of exactly {sorted(top)}, got {got}")
    low = bucket.lower_bounds()
    for name, v in sizes.items():
        if not isinstance(v, int) or isinstance(v, bool) or not low[name] <= v <= top[name]:
            raise BucketMapError(f"split size {name}={str(v)[:20]} is not a size in "
                                 f"[{low[name]}, {top[name]}] (inside the bucket)")
    if sizes == top:
        raise BucketMapError(f"split {sizes} is the bucket's upper bound: a split lies below "
                             "it in at least one Dim")
    regret = obj.get("regret_pct")
    shown = float(regret) if isinstance(regret, (int, float)) and not isinstance(regret, bool) \
        else None
    return Split(tuple(sorted(sizes.items())), shown)


def split_for(splits: Sequence[Split], sizes: Mapping[str, int]) -> Split | None:
    """The sub-bucket a call's Dim sizes map to: the first split point they do not exceed in
    any Dim; None: the declared bucket."""
    return next((s for s in splits if s.holds(sizes)), None)


def layout_class(sizes: Mapping[str, int]) -> str:
    """Which CUBIN a call of these Dim sizes runs, as far as the sizes decide: per Dim ``1``
    (a size-1 dim: another calling convention, a shape constant), ``16`` (a multiple of 16:
    shape divisibility, the exact CUBIN of a bucket whose top is one) or ``n`` (neither: the
    relaxed CUBIN). A bucket's sizes of one layout class share a CUBIN and how its tiles fit;
    ``ctbuild tune`` records a winner per class where they differ (`ctbuild.tune.span`)."""
    return ",".join(f"{n}:{1 if v == 1 else 16 if v % 16 == 0 else 'n'}"
                    for n, v in sorted(sizes.items()))


#: The most layout classes a record's ``by_class`` is read for (a bucket over 3 Dims has 27).
MAX_CLASSES = 32


def class_winners(raw: Any, kernel: str) -> dict[str, Config | WaveTable]:
    """A record's ``by_class`` entry read defensively (it comes from a cache that may be
    shared): per layout class (`layout_class`, a short text) a config given as a JSON object,
    or where the entry has a readable ``waves`` table (`ctbuild.waves.read_table`), the table
    a call of that class chooses its config by; anything else is skipped (the record's own
    ``config`` serves it), and an entry of more than `MAX_CLASSES` is not read."""
    if not isinstance(raw, dict) or len(raw) > MAX_CLASSES:
        return {}
    out: dict[str, Config | WaveTable] = {}
    for cls, entry in raw.items():
        config = entry.get("config") if isinstance(entry, dict) else None
        if isinstance(cls, str) and len(cls) <= 256 and isinstance(config, dict) \
                and all(isinstance(k, str) for k in config):
            dims = [part.split(":")[0] for part in cls.split(",")]
            table = read_table(entry.get("waves"), kernel, dims, Config(config, kernel)) \
                if "waves" in entry else None
            out[cls] = table or Config(config, kernel)
    return out


def describe_bucket(sizes: Mapping[str, int]) -> str:
    """``M<=81, N<=40``: a bucket or sub-bucket by its upper corner."""
    return ", ".join(f"{n}<={v}" for n, v in sorted(sizes.items()))


def why(sizes: Mapping[str, int], bucket: Bucket, splits: Sequence[Split],
        chosen: Split | None) -> str:
    """What `explain` says of a refined bucket: the sub-bucket a size maps to, and why."""
    at = ", ".join(f"{n}={v}" for n, v in sorted(sizes.items()))
    parent = describe_bucket(bucket.to_json())
    if chosen is None:
        return (f"{at} is above every sub-bucket ctbuild tune split from bucket "
                f"{parent} ({'; '.join(describe_bucket(s.sizes) for s in splits)}): the "
                "bucket's own record serves")
    cause = "" if chosen.regret_pct is None else \
        f"; the bucket's winner was {chosen.regret_pct:.1f}% slower there"
    return (f"{at} falls in sub-bucket {describe_bucket(chosen.sizes)}, which ctbuild tune "
            f"split from bucket {parent}{cause}: the sub-bucket's record serves")
