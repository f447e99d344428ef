"""One C call that tells whether a call has exactly the layout of an entry's first call.

The hot path's key is built in Python: per tensor ``.shape``, ``.dtype`` and
``.is_contiguous()``, about 0.25 us each, and hashing and comparing the key costs as much
again. Most calls of a kernel in a service repeat the layout of the call before (every layer
of a model calls its norm with one shape), so the hot path first asks the entry it served last
whether this call is one of its own, the way a JIT's inline cache does, and looks the key up
only when it is not.

The question is answered by torch's own C++ tensor guards (what ``torch.compile`` checks its
graphs with): every tensor's exact type, dtype, device, sizes, strides, ``requires_grad`` and
dispatch keys in one call. Exact sizes and strides decide more than any key level this guard
is used with (`declaration_reads.KEY_LEVELS` ``contiguity`` and ``layout``), so a guard hit
means the key lookup would have found the same entry. Scalars are compared in Python. The
guards are a torch internal: they are checked once per process (`available`) and, where they
are missing or answer wrongly, the hot path simply keeps looking keys up.
"""
from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

#: Times one entry's guard may be rebuilt from a call that its key matched but its guard did
#: not (the first call outside ``torch.inference_mode`` and the rest inside it, say); past
#: that the entry keeps no guard, so calls that alternate never rebuild it per call.
MAX_REGUARDS = 4

#: Where a call's arguments are tensors and where plain scalars (a guard plan).
GuardPlan = tuple[tuple[int, ...], tuple[int, ...]]


def never(*args: Any) -> bool:
    """The guard of an entry that keeps none: no call is its own."""
    return False


@cache
def available() -> bool:
    """Whether torch's tensor guards exist here and tell layouts apart as this module needs."""
    try:
        import torch
        from torch._C._dynamo.guards import TensorGuards
        t = torch.empty(2, 3)
        check = _guard_of((t,), TensorGuards)
        return check(t) and check(torch.empty(2, 3)) and not any(check(o) for o in (
            torch.empty(3, 2), torch.empty(2, 3).as_strided((2, 3), (1, 2)),
            torch.empty(2, 3, dtype=torch.float64), torch.empty(2, 4)[:, :3]))
    except Exception:  # noqa: BLE001 - any failure means: no guards, keys only
        return False


def guard_plan(args: tuple) -> GuardPlan | None:
    """Tensor and scalar positions of calls like ``args``, or None when a guard cannot cover
    them (no tensor, or an argument that is neither a torch tensor nor a plain scalar)."""
    if not available():
        return None
    from .live_args import PLAIN, is_torch_tensor
    tensors, scalars = [], []
    for i, value in enumerate(args):  # classified as `live_args.key_expression` does
        if is_torch_tensor(value):
            tensors.append(i)
        elif type(value) in PLAIN:
            scalars.append(i)
        else:
            return None
    return (tuple(tensors), tuple(scalars)) if tensors else None


def make_guard(args: tuple, plan: GuardPlan) -> Callable[..., bool]:
    """``guard(*tensors)``: True when these tensors have exactly the layout of the tensors of
    ``args`` at the plan's tensor positions (never where that cannot be built)."""
    try:
        from torch._C._dynamo.guards import TensorGuards
        return _guard_of(tuple(args[i] for i in plan[0]), TensorGuards)
    except Exception:  # noqa: BLE001 - a tensor the guards cannot take: keys only
        return never


def scalars_of(args: tuple, plan: GuardPlan) -> tuple:
    """What the hot path compares a call's scalars with: (type, value) per scalar position."""
    out: list[Any] = []
    for i in plan[1]:
        out += (type(args[i]), args[i])
    return tuple(out)


def _guard_of(tensors: tuple, guards: Any) -> Callable[..., bool]:
    return guards(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
                  dynamic_dims_strides=[list(t.stride()) for t in tensors]).check
