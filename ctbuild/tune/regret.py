"""How good a `Dim` bucket's winner is at the sizes inside the bucket, not only at its top.

A bucket is tuned at its representative (its upper bound), and every size of the bucket runs
that winner. Here the winner and its runners-up are timed, interleaved (`runoff`), at the
bucket's lower bound and at geometric midpoints between the bounds; the regret at a size is the
winner's time over the fastest contender's there, minus one. A bucket whose regret exceeds the
tie band is one whose sizes want different configs: it should be split where the regret is.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..dims import Bucket, concretize
from ..space import Config
from ..specs import Workload
from .choice import TieBand
from .runoff import RunoffBudget, runoff

#: Where inside a bucket to time, as fractions of the way from its lower to its upper bound on
#: a log scale (0: the lower bound).
INTERIOR_FRACTIONS = (0.0, 1 / 3, 2 / 3)
#: Contenders timed inside a bucket: the winner and this many runners-up.
RUNNERS_UP = 3
#: A shorter runoff than the key's own: regret is a report, not a decision.
REGRET_BUDGET = RunoffBudget(min_rounds=5, max_rounds=15, max_seconds=1.5)


@dataclass(frozen=True)
class SizeRegret:
    """The winner against the fastest contender at one size inside the bucket."""
    sizes: dict[str, int]
    fastest: Config
    winner_us: float
    fastest_us: float

    @property
    def regret_pct(self) -> float:
        return 100.0 * (self.winner_us / self.fastest_us - 1.0)

    def to_json(self) -> dict[str, Any]:
        return {"sizes": self.sizes, "fastest": self.fastest.to_json(),
                "winner_us": self.winner_us, "fastest_us": self.fastest_us,
                "regret_pct": round(self.regret_pct, 3)}


def interior_sizes(bucket: Bucket) -> list[dict[str, int]]:
    """The sizes to time inside ``bucket`` (its representative excluded), smallest first."""
    out: list[dict[str, int]] = []
    top = dict(bucket.sizes)
    low = bucket.lower_bounds()
    for f in INTERIOR_FRACTIONS:
        sizes = {n: round(low[n] ** (1 - f) * hi ** f) for n, hi in top.items()}
        if sizes != top and sizes not in out:
            out.append(sizes)
    return out


def bucket_regret(bucket: Bucket, winner: Config, runners_up: Sequence[Config],
                  timer_for: Callable[[Workload], Callable[[Config], float]],
                  band: TieBand) -> tuple[list[SizeRegret], list[str]]:
    """Time the winner and up to `RUNNERS_UP` runners-up at the bucket's interior sizes:
    (regret per size, problems). ``timer_for(workload)`` gives a one-launch timer on inputs of
    that concrete workload. A size where the winner cannot be timed is a problem, not a regret."""
    contenders = [winner, *[c for c in runners_up if c != winner][:RUNNERS_UP]]
    out: list[SizeRegret] = []
    problems: list[str] = []
    for sizes in interior_sizes(bucket):
        result = runoff(contenders, timer_for(concretize(bucket.declared, sizes)), band,
                        REGRET_BUDGET) if len(contenders) > 1 else None
        problems += [f"{sizes}: {why}" for _, why in (result.failures if result else ())]
        timings = {t.config: t for t in (result.timings if result else ())}
        if winner not in timings:
            if len(contenders) > 1:
                problems.append(f"{sizes}: the winner could not be timed")
            continue
        fastest = min(timings.values(), key=lambda t: t.mean_us)
        out.append(SizeRegret(sizes, fastest.config, timings[winner].mean_us, fastest.mean_us))
    return out, problems


def summary(regrets: Sequence[SizeRegret], problems: Sequence[str]) -> dict[str, Any]:
    """The record's ``regret`` entry: per size, and the worst."""
    worst = max((r.regret_pct for r in regrets), default=None)
    return {"sizes": [r.to_json() for r in regrets],
            "max_pct": None if worst is None else round(worst, 3),
            "problems": list(problems)}
