"""Which measured candidate wins, by a rule that two tunes of the same key agree on.

Candidates whose times are within noise of each other are not ranked by that noise: they are
*ties*, and among ties the choice is fixed in advance. A candidate ties with the fastest when
its mean is within the band (default 2%) of the fastest mean, or when their 95% confidence
intervals overlap within twice the band (a CI widens the band by the band at most: a
candidate timed on two samples must not tie a loss of 20%). Among the ties the declared
default config wins if it is one of them, else the first of them in the declared
search-space order. So a rebuild on the same GPU model picks the same winner unless a
candidate's true speed sits at the band's edge, and a winner that differs between two tunes
is never more than twice the band slower than the other's.

Pure functions of measurements: the tuner, ``ctbuild tune --verify`` and the fleet merge of
several GPUs all decide through `choose`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from ..space import Config

#: The band's default, in percent of the fastest mean.
DEFAULT_BAND_PERCENT = 2.0
#: The rules `choose` can apply, as recorded in tuning records.
RULE_ONLY = "only candidate"
RULE_FASTEST = "fastest, no tie"
RULE_DEFAULT = "default config among ties"
RULE_FIRST = "first in space order among ties"
#: The bucket's winner: the smallest worst loss over its sizes (`ctbuild.tune.span`).
RULE_SPAN = "smallest worst loss over the bucket's sizes"


class TieBandError(ValueError):
    """A tie band outside (0, 50) percent."""


@dataclass(frozen=True)
class TieBand:
    """Candidates within ``percent`` of the fastest mean, or (``ci_overlap``) whose 95% CI
    overlaps the fastest's, tie with it."""
    percent: float = DEFAULT_BAND_PERCENT
    ci_overlap: bool = True

    def __post_init__(self) -> None:
        if not 0 < self.percent < 50:
            raise TieBandError(f"tie band {self.percent:g}% is outside (0, 50)%: give a percent "
                               "such as 2 or 2%")

    @classmethod
    def parse(cls, text: str) -> TieBand:
        """``"2"`` or ``"2%"`` (percent of the fastest mean)."""
        raw = text.strip().removesuffix("%").strip()
        try:
            value = float(raw)
        except ValueError:
            raise TieBandError(f"tie band {text!r} is not a number: give a percent such as 2 "
                               "or 2%") from None
        return cls(value)

    @property
    def factor(self) -> float:
        return 1 + self.percent / 100

    def to_json(self) -> dict[str, Any]:
        return {"percent": self.percent, "ci_overlap": self.ci_overlap}


@dataclass(frozen=True)
class Timing:
    """One candidate's measured time: mean and 95% CI half-width in microseconds."""
    config: Config
    mean_us: float
    ci_us: float
    samples: int

    def to_json(self) -> dict[str, Any]:
        return {"config": self.config.to_json(), "mean_us": self.mean_us,
                "ci_us": self.ci_us if math.isfinite(self.ci_us) else None,  # one round: no CI
                "samples": self.samples}


@dataclass(frozen=True)
class Choice:
    """The winner, the fastest by mean, the ties (in space order) and the rule that chose."""
    winner: Timing
    fastest: Timing
    ties: tuple[Timing, ...]
    rule: str


def ties_with(t: Timing, fastest: Timing, band: TieBand) -> bool:
    """Whether ``t`` is within the band of ``fastest``, or their CIs overlap within twice
    the band: a CI wider than the band widens it by the band at most, as a candidate timed
    on two samples (a race's size that ended on its budget) must not tie a 20% loss."""
    if t.mean_us <= fastest.mean_us * band.factor:
        return True
    return band.ci_overlap and t.mean_us - t.ci_us <= fastest.mean_us + fastest.ci_us and \
        t.mean_us <= fastest.mean_us * (1 + 2 * band.percent / 100)


def choose(timings: Sequence[Timing], order: Sequence[Config], default: Config | None,
           band: TieBand) -> Choice:
    """Apply the tie rule. ``order`` is the declared space order (configs not in it, e.g.
    recorded extras, come after it, by mean)."""
    if not timings:
        raise ValueError("no timing to choose from")
    position = {cfg: i for i, cfg in enumerate(order)}

    def rank(t: Timing) -> tuple[int, str]:
        return (position.get(t.config, len(position)), str(t.config.to_json()))

    fastest = min(timings, key=lambda t: (t.mean_us, rank(t)))
    ties = tuple(sorted((t for t in timings if ties_with(t, fastest, band)), key=rank))
    if len(timings) == 1:
        return Choice(fastest, fastest, ties, RULE_ONLY)
    if len(ties) == 1:
        return Choice(fastest, fastest, ties, RULE_FASTEST)
    by_default = next((t for t in ties if default is not None and t.config == default), None)
    if by_default is not None:
        return Choice(by_default, fastest, ties, RULE_DEFAULT)
    return Choice(ties[0], fastest, ties, RULE_FIRST)

