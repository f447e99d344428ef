"""The one rule for sizes beyond a `Dim`'s range, which the runtime (a ``range`` miss: strict
mode raises) and `explain` (a miss whose why names the range) both apply through this module.

**The rule.** A call is served only if one declared workload admits its sizes at every
position (argument, dimension) that some workload bounds with a `Dim`: there that workload's
Dim range holds the call's size, or its static size is the call's. Compared are the workloads
one of whose CUBINs could serve the call at all (the call's arguments, dtypes, ranks, scalar
types and ``ct.Constant`` values); what else the call leaves undeclared -- strides, base
alignment, a size where no Dim bounds the dimension (another pool size), one Dim given two
sizes -- changes nothing: a call beyond every range is a miss with or without it.

**Why this way.** A Dim's range is a bound the user declared and the build checked: the plan
refuses a range whose upper bound overflows cuTile's int32 indexing or CUDA's grid limits,
tuning measured the buckets up to that bound, and their records are chosen inside it. A size
beyond it went through none of this. That a cached CUBIN's assumptions hold (the generic
CUBIN's hold for any size) says only that it would launch, not that the build planned,
checked or tuned the size; and a strided view or another static size, which only sends the
call to that generic CUBIN, does not make the size any more declared. So the answer is the
same with or without them: not served. A static size bounds nothing: other sizes of a
dimension no Dim bounds are served by the generic CUBIN, like any undeclared layout.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from .dims import Dim
from .miss_reasons import Gap, gaps
from .specs import Tensor, Workload

#: Gap kinds a relaxed or generic CUBIN of the declaration still serves: a call with others
#: (a dtype, a rank, a constant...) is no CUBIN's of it, whatever its sizes.
SERVABLE = frozenset({"range", "size", "layout"})


def beyond_range(declared: Sequence[Workload], call: Mapping[str, Any],
                 constants: frozenset[str]) -> str | None:
    """What of the call is beyond the declared ranges (one phrase), or None when the rule
    serves it (or when no CUBIN of the declarations could serve it anyway)."""
    refused = _verdict(declared, call, constants)[1]
    return None if refused is None else refused[1]


def explain_candidates(declared: Sequence[Workload], call: Mapping[str, Any],
                       constants: frozenset[str]) -> list[Workload]:
    """The workloads `explain` names the nearest of: for a call beyond range the one whose
    range refuses it (so its why names the range the runtime refused it for); for a call the
    rule serves, those admitting its sizes (so its why never names a range the call is not
    refused for); else every declared one."""
    admitting, refused = _verdict(declared, call, constants)
    if refused is not None:
        return [refused[0]]
    return admitting or list(declared)


def _verdict(declared: Sequence[Workload], call: Mapping[str, Any], constants: frozenset[str]
             ) -> tuple[list[Workload], tuple[Workload, str] | None]:
    """(the workloads admitting the call's sizes, (the nearest refusing workload, what it
    refuses) when none admits them). Without a Dim among the compatible workloads both are
    empty: there is no range to be beyond."""
    compatible = [(w, found) for w, found in ((w, gaps(w, call, constants)) for w in declared)
                  if all(g.kind in SERVABLE for g in found)]
    bounded = sorted({(name, i) for w, _ in compatible for name, d in w.items()
                      if isinstance(d, Tensor)
                      for i, size in enumerate(d.shape) if isinstance(size, Dim)})
    if not bounded:
        return [], None
    admitting, refusing = [], []
    for w, found in compatible:
        blocking = _blocking(w, found, call, bounded)
        if blocking:
            refusing.append((len(blocking), len(found), w, "; ".join(blocking)))
        else:
            admitting.append(w)
    if admitting or not refusing:
        return admitting, None
    _, _, w, text = min(refusing, key=lambda r: r[:2])  # the first of equals
    return [], (w, text)


def _blocking(w: Workload, found: list[Gap], call: Mapping[str, Any],
              bounded: list[tuple[str, int]]) -> list[str]:
    """Why ``w`` does not admit the call's sizes: its range gaps, and its static sizes other
    than the call's where another workload bounds the dimension with a Dim."""
    out = [g.text for g in found if g.kind == "range"]
    for name, i in bounded:
        d, v = w.get(name), call.get(name)
        if isinstance(d, Tensor) and isinstance(v, Tensor) and not isinstance(d.shape[i], Dim) \
                and d.shape[i] != v.shape[i]:
            out.append(f"{name} dim {i}: size {v.shape[i]}, declared {d.shape[i]} (a Dim bounds "
                       "this dim in another workload)")
    return out


__all__ = ["SERVABLE", "beyond_range", "explain_candidates"]
