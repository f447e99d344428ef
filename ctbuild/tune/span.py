"""One winner for every size a `Dim` bucket serves, or a split where no config is good at all.

A bucket serves every size from its lower bound to its upper bound with one config. Its key's
own size (the upper bound) is screened and raced (`ctbuild.tune.race`); then every screened
candidate races again at the other sizes `ctbuild.tune.span_sizes` names. The loss of a config
at a size is its time over the fastest there, minus one; a dropped candidate's loss is its time
when dropped.

The winner is the config whose worst loss over the sizes is smallest; ties (worst losses within
the band of the smallest, or whose CIs overlap its) go to the default config, else the first in
space order (`ctbuild.tune.choice`). Where even that worst loss exceeds the band, the bucket is
split along the Dim that leaves the least loss (`Span.split`): from the top down, each
sub-bucket takes the smaller sizes while one config (or one per layout class) stays within the
band over all of them, at most `DEFAULT_SPLITS` times along each Dim by default; each
sub-bucket that still loses more is split again along another Dim. A sub-bucket's upper corner
is its split point (`ctbuild.bucket_map`); its winner is recorded under the point's own tuning
key, from the times already measured: nothing is measured twice. A sub-bucket that holds sizes
of a layout class none of its raced sizes has is served there by a config chosen at the
nearest raced sizes of that class (`Span.borrow`).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ..bucket_map import MAX_POINTS, Split, layout_class
from ..dims import Bucket
from ..space import Config
from ..waves import WaveTable, apart
from .choice import TieBand, Timing, choose

#: The most times a bucket is split along each Dim by default (``--refine N``,
#: ``max_splits=``).
DEFAULT_SPLITS = 3
#: How many raced sizes of a layout class choose a sub-bucket's config for that class where
#: none of its own sizes has it (`Span.borrow`): the nearest to its sizes.
NEAREST = 2


def within(worst: float, ci: float, band: TieBand) -> bool:
    """Whether a worst loss (a fraction) is within the band, or its 95% CI half-width ``ci``
    reaches into it (as a time within its CI of the fastest ties with it): a group at the
    band's edge is split or given class winners on noise, and two tunes then serve it
    differently (`benchmarks/tune_reproducibility.py`). The CI counts up to the band: a
    group timed on two samples at some size (CI 20%) served a 17% loss unsplit."""
    edge = band.percent / 100
    return worst - (min(ci, edge) if band.ci_overlap else 0.0) <= edge


@dataclass
class Group:
    """Consecutive sizes of a bucket that one config serves: indices into `Span.sizes`, the
    winner, its worst loss, (below the top) the split point, and where the sizes of another
    layout class want another config, the winner of each class (`Span.pick`); the 95% CI
    half-width of the worst loss."""
    members: list[int]
    winner: Config
    worst_pct: float
    point: dict[str, int] | None = None
    by_class: dict[str, Config] = field(default_factory=dict)
    ci: float = 0.0

    def within(self, band: TieBand) -> bool:
        """Whether its worst loss is within the band (`within`)."""
        return within(self.worst_pct, self.ci, band)

    def serves(self, span: Span, i: int) -> Config:
        """The config that serves size ``i`` of the group."""
        return self.for_class(span.cls(i))

    def for_class(self, cls: str) -> Config:
        """The config that serves the group's sizes of layout class ``cls``."""
        return self.by_class.get(cls, self.winner)


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
        winner, worst, ci = self._pick(members, order, default, band)
        return Group(list(members), winner, worst, ci=ci)

    def _pick(self, members: Sequence[int], order: Sequence[Config], default: Config | None,
              band: TieBand) -> tuple[Config, float, float]:
        """(the config with the smallest worst loss over ``members``, by the tie rule applied
        to worst losses and their CIs, as to times at one size; that loss). A worst loss is a
        maximum over sizes each timed with noise: two tunes that rank configs by it alone
        disagree wherever two of them are a CI apart beyond the band."""
        worst = self.worst_ci(members)
        scores = [Timing(c, 1 + w, ci, 1) for c, (w, ci) in worst.items()]
        winner = choose(scores, order, default, band).winner
        return (winner.config, *worst[winner.config])

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
                             if not whole.within(band) else None)
        whole = self._by_layout(whole, order, default, band)  # may serve all within the band
        if whole.within(band):
            return [whole], None
        groups, why = self._split(order, default, band, limit, refuse or (lambda points: None),
                                  [], ())
        groups = self.borrow([self._by_layout(g, order, default, band) for g in groups],
                             order, default, band)
        return groups, None if all(g.within(band) for g in groups) else why

    def borrow(self, groups: list[Group], order: Sequence[Config], default: Config | None,
               band: TieBand) -> list[Group]:
        """``groups`` (a split, in the runtime's order), each given a config for every layout
        class it holds sizes of (`_holds`) but has no raced size of, where the one chosen at
        the `NEAREST` raced sizes of that class nearest its own (the tie rule on their worst
        loss) is not what it would serve them with. A part of a split may be cut to raced
        sizes of one class (attention's S in 2897..4095 to S=4095): its winner was chosen on
        none of the other class's sizes, which may run another CUBIN 5x faster or slower
        (served so, attention over ``BH x S`` lost p95 31% at drawn sizes, borrowing 10%:
        `benchmarks/bucket_regret.py --measure`)."""
        raced: dict[str, list[int]] = {}
        for i in range(len(self.sizes)):
            raced.setdefault(self.cls(i), []).append(i)
        if "" in raced:
            return groups
        for k, g in enumerate(groups):
            mine = {self.cls(i) for i in g.members}
            for cls in sorted(self._holds(groups, k) & set(raced) - mine):
                near = sorted(raced[cls], key=lambda i: min(
                    apart(self.sizes[i], self.sizes[m]) for m in g.members))[:NEAREST]
                cfg = self._pick(near, order, g.winner, band)[0]
                if cfg != g.for_class(cls):
                    g.by_class[cls] = cfg
        return groups

    def _holds(self, groups: Sequence[Group], k: int) -> set[str]:
        """The layout classes of the sizes the runtime may map to part ``k`` of a split:
        per Dim those above the largest size an earlier point that covers the part's other
        Dims takes, up to the part's own point (a box around what the part serves)."""
        low, top = self.bucket.lower_bounds(), self.sizes[self.top]
        point = groups[k].point or top
        reps: list[list[int]] = []
        for name in sorted(point):
            floor = max([low[name] - 1] + [
                p[name] for p in (g.point for g in groups[:k]) if p is not None and
                p[name] < point[name] and all(p[o] >= point[o] for o in point if o != name)])
            hi = point[name]
            aligned = 16 * (hi // 16)
            other = next((v for v in range(hi, max(floor, hi - 17), -1) if v != 1 and v % 16),
                         None)
            reps.append([v for v in (1 if floor < 1 else None, aligned if aligned > floor
                                     and aligned > 0 else None, other) if v is not None])
        names = sorted(point)
        return {layout_class(dict(zip(names, combo))) for combo in itertools.product(*reps)}

    def _by_layout(self, group: Group, order: Sequence[Config], default: Config | None,
                   band: TieBand) -> Group:
        """``group`` with each layout class's own winner where it loses more than the band,
        its sizes come in several layout classes (`ctbuild.bucket_map.layout_class`: a size
        divisible by 16 runs another CUBIN than one that is not, and a tile may fit one and
        not the other) and that leaves less loss beyond the band summed over its sizes, its
        worst loss at most the band above the group's (where one class's worst loss stays,
        the other's sizes are still better served); the group's winner is then the one of its
        split point's class (the bucket's top's). For a whole bucket only where that serves it
        within the band, else for each part of a split: a class's winner is chosen on fewer
        sizes than the group's (measured: splitting by class first served the sizes between
        the raced ones worse, `bucket_regret.py --measure`)."""
        kinds = self._kinds(group.members)
        if group.within(band) or len(kinds) < 2:
            return group
        per = {k: self._pick(m, order, default, band) for k, m in sorted(kinds.items())}
        _, worst, ci = max(per.values(), key=lambda p: p[1])
        rep = self.sizes.index(group.point) if group.point else self.top
        classed = Group(group.members, per[self.cls(rep)][0], worst, group.point,
                        {k: c for k, (c, _, _) in per.items()}, ci)
        if worst > group.worst_pct + band.percent / 100 or \
                self._score([classed], band)[1] >= self._score([group], band)[1]:
            return group
        return classed

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
        if why is None and not all(g.within(band) for g in groups):
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
            if g.within(band) or corner not in g.members:
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
        """Whether one config serves ``members`` within the band (`within`), or one per
        layout class where each class has two sizes at least (a winner chosen at one size of
        its class served the sizes between worse: `benchmarks/bucket_regret.py
        --measure`)."""
        kinds = self._kinds(members)
        if not kinds or min(map(len, kinds.values())) < 2:
            kinds = {"": members}
        return all(any(within(w, ci, band) for w, ci in self.worst_ci(m).values())
                   for m in kinds.values())

    def regret_json(self, group: Group, bucket: dict[str, int], unsplit: str | None = None,
                    tables: Mapping[str, WaveTable] | None = None) -> dict[str, Any]:
        """The record's ``regret`` entry of a group's winner: its loss at each of the group's
        sizes (its own point, where it was chosen, included; a size of a layout class with its
        own winner at that winner's, or with a wave table in ``tables`` at the finalist its
        table chooses there, as a call of that size is served), the worst, every config's
        worst loss over those sizes (what the choice was made on), and why the bucket was not
        split further (``unsplit``)."""
        rows: list[dict[str, Any]] = []
        for i in group.members:
            table = (tables or {}).get(self.cls(i))
            chosen = table.chosen_at(self.sizes[i]) if table is not None else None
            served = chosen if chosen is not None else group.serves(self, i)
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

    def without(self, classes: set[str]) -> Span:
        """This span with no size of the layout ``classes`` (the upper bound kept last)."""
        keep = [i for i in range(len(self.sizes)) if self.cls(i) not in classes]
        return Span(self.bucket, [self.sizes[i] for i in keep], [self.times[i] for i in keep],
                    classes=[self.cls(i) for i in keep])

    def regroup(self, groups: Sequence[Group]) -> list[Group]:
        """``groups`` of a span of some of these sizes (`without`), as groups of this span:
        each holds every size the runtime serves by it, the first whose point holds it."""
        left = list(range(len(self.sizes)))
        out = []
        for g in groups:
            mine = [i for i in left if g.point is None or
                    all(self.sizes[i][n] <= g.point[n] for n in g.point)]
            taken = set(mine)
            left = [i for i in left if i not in taken]
            out.append(Group(mine, g.winner, g.worst_pct, g.point, dict(g.by_class), g.ci))
        return out

    def as_split(self, group: Group, served: Config) -> Split:
        """A group below the top as the bucket map's split point, with the loss the bucket's
        own winner (``served``) would have had there."""
        assert group.point is not None
        i = self.sizes.index(group.point)
        pct = 100 * self.loss(i, served) if served in self.times[i] else None
        return Split(tuple(sorted(group.point.items())), None if pct is None else round(pct, 3))
