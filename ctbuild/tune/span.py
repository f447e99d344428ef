"""One winner for every size a `Dim` bucket serves, or a split where no config is good at all.

A bucket serves every size from its lower bound to its upper bound with one config. Its key's
own size (the upper bound) is screened and raced (`ctbuild.tune.race`); then every screened
candidate races again at the other sizes `span_sizes` names: along each Dim its lower bound,
powers of two in between and the size one above each (where a power-of-two tile goes from
filled exactly to almost half empty), geometric midpoints (on multiples of 16, the other layout
class), and below the upper bound the midpoint of a wide gap and the size one below a bound
that is a multiple of 16 (another layout class); with several Dims every combination of those
points (a grid). The loss of a config at a size is its time over the fastest there, minus one;
a dropped candidate's loss is its time when dropped.

The winner is the config whose worst loss over the sizes is smallest; ties (worst losses within
the band of the smallest, or whose CIs overlap its) go to the default config, else the first in
space order
(`ctbuild.tune.choice`). Where even that worst loss exceeds the band, the bucket is split along
the Dim that leaves the least loss (`Span.split`): from the top down, each sub-bucket takes the
smaller sizes while one config (or one per layout class) stays within the band over all of
them, at most `DEFAULT_SPLITS` times along each Dim by default; each sub-bucket that still
loses more is split again along another Dim. A sub-bucket's upper corner is its split point
(`ctbuild.bucket_map`); its winner is recorded under the point's own tuning key, from the times
already measured: nothing is measured twice.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..bucket_map import MAX_POINTS, Split
from ..dims import Bucket
from ..space import Config
from .choice import TieBand, Timing, choose

#: The most sizes below its upper bound raced along one Dim of a bucket over one Dim, and
#: over several (each of its Dims, whose points then form a grid).
MAX_PER_DIM = (7, 4)
#: The most sizes of a grid over a bucket's Dims (more Dims race their lines alone).
MAX_GRID = 64
#: The most times a bucket is split along each Dim by default (``--refine N``,
#: ``max_splits=``).
DEFAULT_SPLITS = 3


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


@dataclass
class Group:
    """Consecutive sizes of a bucket that one config serves: indices into `Span.sizes`, the
    winner, its worst loss, (below the top) the split point, and where the sizes of another
    layout class want another config, the winner of each class (`Span.pick`)."""
    members: list[int]
    winner: Config
    worst_pct: float
    point: dict[str, int] | None = None
    by_class: dict[str, Config] = field(default_factory=dict)

    def serves(self, span: Span, i: int) -> Config:
        """The config that serves size ``i`` of the group."""
        return self.by_class.get(span.cls(i), self.winner)


@dataclass
class Span:
    """The times of a bucket's candidates at each of its sizes (the upper bound last)."""
    bucket: Bucket
    sizes: list[dict[str, int]]
    times: list[dict[Config, Timing]]
    problems: list[str] = field(default_factory=list)
    #: per size below the top, what its race cost: candidates raced, rounds, why it stopped
    races: list[dict[str, Any]] = field(default_factory=list)
    #: per size, its layout class (`ctbuild.bucket_map.layout_class`: which CUBIN it runs)
    classes: list[str] = field(default_factory=list)

    @property
    def top(self) -> int:
        return len(self.sizes) - 1

    def loss(self, i: int, cfg: Config) -> float:
        """``cfg``'s time at size ``i`` over the fastest there, minus one."""
        fastest = min(t.mean_us for t in self.times[i].values())
        return self.times[i][cfg].mean_us / fastest - 1

    def cls(self, i: int) -> str:
        """The layout class of size ``i`` ("" unknown)."""
        return self.classes[i] if i < len(self.classes) else ""

    def _kinds(self, members: Sequence[int]) -> dict[str, list[int]]:
        """``members`` by layout class; {} where a class is unknown."""
        kinds: dict[str, list[int]] = {}
        for i in members:
            kinds.setdefault(self.cls(i), []).append(i)
        return {} if "" in kinds else kinds

    def worst(self, members: Sequence[int]) -> dict[Config, float]:
        """Per config timed at every one of ``members``, its worst loss there."""
        return {c: w for c, (w, _) in self.worst_ci(members).items()}

    def worst_ci(self, members: Sequence[int]) -> dict[Config, tuple[float, float]]:
        """Per config timed at every one of ``members``: its worst loss there, and that loss's
        95% CI half-width (its time's and the fastest's there, relative, combined)."""
        common = set.intersection(*(set(self.times[i]) for i in members))
        fastest = {i: min(self.times[i].values(), key=lambda t: t.mean_us) for i in members}
        out = {}
        for c in common:
            i = max(members, key=lambda m: self.times[m][c].mean_us / fastest[m].mean_us)
            t, f = self.times[i][c], fastest[i]
            ratio = t.mean_us / f.mean_us
            out[c] = (ratio - 1, ratio * math.hypot(t.ci_us / t.mean_us, f.ci_us / f.mean_us))
        return out

    def pick(self, members: Sequence[int], order: Sequence[Config], default: Config | None,
             band: TieBand) -> Group:
        """The group of ``members``, served by one config (`_pick`)."""
        return Group(list(members), *self._pick(members, order, default, band))

    def _pick(self, members: Sequence[int], order: Sequence[Config], default: Config | None,
              band: TieBand) -> tuple[Config, float]:
        """(the config with the smallest worst loss over ``members``, by the tie rule applied
        to worst losses and their CIs, as to times at one size; that loss). A worst loss is a
        maximum over sizes each timed with noise: two tunes that rank configs by it alone
        disagree wherever two of them are a CI apart beyond the band."""
        worst = self.worst_ci(members)
        scores = [Timing(c, 1 + w, ci, 1) for c, (w, ci) in worst.items()]
        winner = choose(scores, order, default, band).winner
        return winner.config, worst[winner.config][0]

    def lines(self) -> dict[str, list[int]]:
        """Per Dim the sizes along it (the other Dims at their upper bound), smallest first,
        the upper bound last."""
        top = self.sizes[self.top]
        axes: dict[str, list[int]] = {name: [] for name in sorted(top)}
        for i, s in enumerate(self.sizes):
            moved = [n for n in s if s[n] != top[n]]
            if len(moved) == 1:
                axes[moved[0]].append(i)
        return {name: sorted(ix, key=lambda i: self.sizes[i][name]) + [self.top]
                for name, ix in axes.items()}

    def split(self, order: Sequence[Config], default: Config | None, band: TieBand,
              limit: int, refuse: Callable[[list[dict[str, int]]], str | None] | None = None
              ) -> tuple[list[Group], str | None]:
        """The groups the bucket is served by, in the order the runtime tries their split
        points, the top last (one: unsplit), and why it is not split further where its worst
        loss still exceeds the band (None: it does not). Where a winner per layout class
        serves the whole bucket within the band, it is not split (`_by_layout`); else a group
        of the split that still loses more than the band gets them where that helps;
        ``limit`` 0 (``--no-refine``) allows neither. The split along the Dim that leaves
        the least loss (`_score`), at most ``limit`` times along each Dim; each group that
        still loses more than the band is split again along another Dim (`_nest`: its points
        come before its corner's, as the runtime serves a size by the first point that holds
        it). ``refuse(points)``: why a split at these points cannot be recorded (None: it
        can); a refused split leaves the bucket whole, for that reason."""
        everything = list(range(len(self.sizes)))
        whole = self.pick(everything, order, default, band)
        if limit == 0:  # one winner for the whole bucket, whatever the layout classes
            return [whole], ("splitting is off (--no-refine)"
                             if whole.worst_pct * 100 > band.percent else None)
        whole = self._by_layout(whole, order, default, band)  # may serve all within the band
        if whole.worst_pct * 100 <= band.percent:
            return [whole], None
        groups, why = self._split(order, default, band, limit, refuse or (lambda points: None),
                                  [], ())
        groups = [self._by_layout(g, order, default, band) for g in groups]
        return groups, why if max(g.worst_pct for g in groups) * 100 > band.percent else None

    def _by_layout(self, group: Group, order: Sequence[Config], default: Config | None,
                   band: TieBand) -> Group:
        """``group`` with each layout class's own winner where it loses more than the band,
        its sizes come in several layout classes (`ctbuild.bucket_map.layout_class`: a size
        divisible by 16 runs another CUBIN than one that is not, and a tile may fit one and
        not the other) and that leaves less loss; the group's winner is then the one of its
        split point's class (the bucket's top's). For a whole bucket only where that serves it
        within the band, else for each part of a split: a class's winner is chosen on fewer
        sizes than the group's (measured: splitting by class first served the sizes between
        the raced ones worse, `bucket_regret.py --measure`)."""
        kinds = self._kinds(group.members)
        if group.worst_pct * 100 <= band.percent or len(kinds) < 2:
            return group
        per = {k: self._pick(m, order, default, band) for k, m in sorted(kinds.items())}
        apart = max(w for _, w in per.values())
        if apart >= group.worst_pct:
            return group
        rep = self.sizes.index(group.point) if group.point else self.top
        return Group(group.members, per[self.cls(rep)][0], apart, group.point,
                     {k: c for k, (c, _) in per.items()})

    def _split(self, order: Sequence[Config], default: Config | None, band: TieBand,
               limit: int, refuse: Callable[[list[dict[str, int]]], str | None],
               others: list[Group], done: Sequence[str]) -> tuple[list[Group], str | None]:
        """`split` along the Dims not in ``done`` (those the split this one nests in cut
        along), then each group that still loses more than the band along another
        (`_nest`); ``others``: the groups of the enclosing splits (their points must keep
        apart from these)."""
        everything = list(range(len(self.sizes)))
        whole = self.pick(everything, order, default, band)
        tries: list[tuple[list[Group], str | None]] = []
        for name, line in self.lines().items():
            if name in done or len(line) < 2:
                continue
            groups, why = self._split_along(name, line, order, default, band, limit)
            no = refuse([g.point for g in [*others, *groups] if g.point]) \
                if len(groups) > 1 else None
            tries.append(([whole], no) if no else self._nest(
                groups, why, order, default, band, limit, refuse, others, [*done, name]))
        groups, why = min(tries, key=lambda t: self._score(t[0], band), default=([whole], None))
        if why is None and max(g.worst_pct for g in groups) * 100 > band.percent:
            why = ("the loss left is at sizes no split along one Dim at a time serves apart "
                   f"(split along {', then '.join(self._cut(groups) or done)})"
                   if len(groups) > 1 else
                   "no size can be served apart from the others along any Dim")
        return groups, why

    def _cut(self, groups: Sequence[Group]) -> dict[str, None]:
        """The Dims ``groups``' split points cut along (below this span's top), in order."""
        top = self.sizes[self.top]
        return dict.fromkeys(n for g in groups if g.point for n, v in g.point.items()
                             if v < top[n])

    def _score(self, groups: list[Group], band: TieBand) -> tuple[float, float, int]:
        """How much loss a split leaves, to compare splits by: the worst group's (within the
        band: none), then the loss beyond the band summed over the sizes, then the groups."""
        floor = band.percent / 100
        return (max(max(floor, g.worst_pct) for g in groups),
                sum(max(0.0, self.loss(i, g.serves(self, i)) - floor) for g in groups
                    for i in g.members if g.serves(self, i) in self.times[i]), len(groups))

    def _nest(self, groups: list[Group], why: str | None, order: Sequence[Config],
              default: Config | None, band: TieBand, limit: int,
              refuse: Callable[[list[dict[str, int]]], str | None], others: list[Group],
              done: list[str]) -> tuple[list[Group], str | None]:
        """``groups`` (a split along ``done[-1]``) with each group that loses more than the
        band split again along another Dim, where that leaves it less loss: its sizes as a
        span whose top is the group's corner (each sub-bucket may be split ``limit`` times
        along each Dim; the points stay within `MAX_POINTS`). A nested group's points come
        before its corner's: the runtime serves a size by the first point that holds it."""
        if len(groups) < 2:
            return groups, why
        out: list[Group] = []
        for k, g in enumerate(groups):
            corner = self.sizes.index(g.point) if g.point else self.top
            if g.worst_pct * 100 <= band.percent or corner not in g.members:
                out.append(g)
                continue
            members = sorted(g.members, key=lambda i: i == corner)
            sub = Span(self.bucket, [self.sizes[i] for i in members],
                       [self.times[i] for i in members], classes=[self.cls(i) for i in members])
            nested, nested_why = sub._split(order, default, band, limit, refuse,
                                            [*others, *out, *groups[k + 1:]], done)
            if len(nested) < 2 or max(n.worst_pct for n in nested) >= g.worst_pct or \
                    len(out) + len(nested) + len(groups) - k - 2 > MAX_POINTS:
                out.append(g)
                continue
            for n in nested:
                n.members = [members[i] for i in n.members]
            nested[-1].point = g.point
            out += nested
            why = nested_why if g.point is None else why
        return out, why

    def _split_along(self, name: str, line: list[int], order: Sequence[Config],
                     default: Config | None, band: TieBand, limit: int
                     ) -> tuple[list[Group], str | None]:
        """(the groups of a split along ``name``, why not further: the limit)."""
        runs, limited = self._runs(line, name, band, limit)
        why = f"the split limit ({limit}) is reached" if limited else None
        return self._groups(runs, name, order, default, band), why

    def _runs(self, line: list[int], name: str, band: TieBand, limit: int
              ) -> tuple[list[list[int]], bool]:
        """``line`` cut into runs from the top down: each run takes smaller sizes while one
        config (or one per layout class, `_served`) stays within the band over all of them and
        the sizes off the line whose ``name`` falls in the run's range (the grid's, or the
        corner and middle: served by the same sub-bucket); past ``limit + 1`` runs the
        lowest merge. Also: whether they merged. (Cutting where the least loss is left over
        the raced sizes instead fits those sizes and serves the sizes between them worse:
        `benchmarks/bucket_regret.py --measure`.)"""
        off = [i for i in range(len(self.sizes)) if i not in line]

        def held(lo: int, hi: int) -> list[int]:
            floor = self.sizes[line[lo - 1]][name] if lo > 0 else -1
            return line[lo:hi + 1] + [i for i in off if floor < self.sizes[i][name]
                                      <= self.sizes[line[hi]][name]]
        runs: list[list[int]] = []
        hi = len(line) - 1
        while hi >= 0:
            lo = hi
            while lo > 0 and self._served(held(lo - 1, hi), band):
                lo -= 1
            runs.insert(0, line[lo:hi + 1])
            hi = lo - 1
        if len(runs) - 1 <= limit:
            return runs, False
        return [sum(runs[:len(runs) - limit], []), *runs[len(runs) - limit:]], True

    def _groups(self, runs: list[list[int]], name: str, order: Sequence[Config],
                default: Config | None, band: TieBand) -> list[Group]:
        """The runs as groups, smallest first: each run's split point is its largest size
        along ``name`` (the other Dims at this span's top); a size off the line (the grid's,
        or the corner and middle) joins the group whose range along ``name`` holds it; runs
        with the same winner merge, unless one is served within the band and the merged group
        would not be (it stays apart: `_nest` may split the other along another Dim)."""
        top = self.sizes[self.top]
        bounds = [max(self.sizes[i][name] for i in r) for r in runs]
        members = [list(r) for r in runs]
        on_line = {i for r in runs for i in r}
        for i in range(len(self.sizes)):
            if i not in on_line:
                v = self.sizes[i][name]
                members[next(k for k, b in enumerate(bounds) if v <= b)].append(i)
        groups: list[Group] = []
        for m, b in zip(members, bounds):
            group = self.pick(m, order, default, band)
            merged = self.pick(groups[-1].members + m, order, default, band) \
                if groups and groups[-1].winner == group.winner else None
            if merged is not None and merged.worst_pct <= max(
                    band.percent / 100, min(groups[-1].worst_pct, group.worst_pct)):
                groups.pop()
                group = merged
            group.point = {**top, name: b}
            groups.append(group)
        groups[-1].point = None
        return [self._by_layout(g, order, default, band) for g in groups]

    def _served(self, members: list[int], band: TieBand) -> bool:
        """Whether one config serves ``members`` within the band, or one per layout class
        where each class has two sizes at least (a winner chosen at one size of its class
        served the sizes between worse: `benchmarks/bucket_regret.py --measure`)."""
        kinds = self._kinds(members)
        if not kinds or min(map(len, kinds.values())) < 2:
            kinds = {"": members}
        return all(min(self.worst(m).values(), default=1.0) * 100 <= band.percent
                   for m in kinds.values())

    def regret_json(self, group: Group, bucket: dict[str, int], unsplit: str | None = None
                    ) -> dict[str, Any]:
        """The record's ``regret`` entry of a group's winner: its loss at each of the group's
        sizes (its own point, where it was chosen, included; a size of a layout class with its
        own winner at that winner's), the worst, every config's worst loss over those sizes
        (what the choice was made on), and why the bucket was not split further
        (``unsplit``)."""
        rows: list[dict[str, Any]] = []
        for i in group.members:
            served = group.serves(self, i)
            if served not in self.times[i]:
                continue
            fastest = min(self.times[i].values(), key=lambda t: t.mean_us)
            rows.append({"sizes": self.sizes[i], "fastest": fastest.config.to_json(),
                         "winner_us": self.times[i][served].mean_us,
                         "fastest_us": fastest.mean_us,
                         "regret_pct": round(100 * self.loss(i, served), 3),
                         "layout_class": self.cls(i) or None,
                         **({"served": served.to_json()} if served != group.winner else {}),
                         **(self.races[i] if i < len(self.races) else {})})
        worst = sorted(((w, ci, c.to_json()) for c, (w, ci) in
                        self.worst_ci(group.members).items()), key=lambda wc: wc[0])
        return {"bucket": bucket, "lower": self.bucket.lower_bounds(), "sizes": rows,
                "max_pct": max((r["regret_pct"] for r in rows), default=None),
                "worst": [{"config": c, "worst_pct": round(100 * w, 3),
                           "ci_pct": round(100 * ci, 3)} for w, ci, c in worst],
                "worst_pct": round(100 * group.worst_pct, 3), "unsplit": unsplit,
                "problems": list(self.problems)}

    def as_split(self, group: Group, served: Config) -> Split:
        """A group below the top as the bucket map's split point, with the loss the bucket's
        own winner (``served``) would have had there."""
        assert group.point is not None
        i = self.sizes.index(group.point)
        pct = 100 * self.loss(i, served) if served in self.times[i] else None
        return Split(tuple(sorted(group.point.items())), None if pct is None else round(pct, 3))
