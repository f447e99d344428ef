"""One C call that tells whether a call has exactly the layout of an entry's first call.

The hot path's key is built in Python: per tensor ``.shape``, ``.dtype`` and
``.is_contiguous()``, about 0.25 us each, and hashing and comparing the key costs as much
again. Most calls of a kernel in a service repeat the layout of the call before (every layer
of a model calls its norm with one shape), so the hot path first asks the entry it served last
whether this call is one of its own, the way a JIT's inline cache does, and looks the key up
only when it is not.

Two guards answer the question, each checked once per process before it is trusted:

- ``_fast_path`` (C, built with the package where a C compiler is found): every tensor's
  exact type, device, dtype, sizes and strides, read through torch's DLPack C exchange API,
  and every scalar's exact type and value, in one call over all the arguments. It needs no
  torch headers, so one build serves any torch that exports that API (2.11 and later);
  ``CTBUILD_NATIVE_GUARD=0`` turns it off.
- torch's own C++ tensor guards (what ``torch.compile`` checks its graphs with) otherwise:
  every tensor's exact type, dtype, device, sizes, strides, ``requires_grad`` and dispatch
  keys; scalars are then compared in Python. About 0.1 us more per call of three tensors.

Exact sizes and strides decide more than any key level a guard is used with
(`declaration_reads.KEY_LEVELS` ``contiguity`` and ``layout``), so a guard hit means the key
lookup would have found the same entry. Where neither guard is available or answers wrongly,
the hot path simply keeps looking keys up.
"""
from __future__ import annotations

import os
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


#: A call's guard and the scalars the hot path compares itself: ``(guard, ())`` where the
#: guard checks every argument, ``(guard, (type, value, ...))`` where it checks tensors only.
Guard = tuple[Callable[..., bool], tuple]


@cache
def available() -> bool:
    """Whether a guard exists here and tells layouts apart as this module needs."""
    return native_guard() is not None or _torch_guards() is not None


@cache
def native_guard() -> Any:
    """The C guard's type (`_fast_path.LayoutCheck`), where it was built, is not turned off
    and passes the self-test; else None."""
    if _turned_off():
        return None
    try:
        from ._fast_path import LayoutCheck
    except ImportError:
        return None

    ok = _passes_self_test(lambda probe: LayoutCheck(probe, (0,), ())) and \
        _scalars_told_apart(LayoutCheck)
    return LayoutCheck if ok else None


def _turned_off() -> bool:
    """Whether ``CTBUILD_NATIVE_GUARD=0`` turns the C module off."""
    return os.environ.get("CTBUILD_NATIVE_GUARD", "1") == "0"


def native_call() -> Any:
    """The C type of an entry's own call code (`_fast_path.ArmedCall`), where the C guard is
    used; else None."""
    if native_guard() is None:
        return None
    from ._fast_path import ArmedCall
    return ArmedCall


@cache
def _torch_guards() -> Any:
    """torch's tensor guards, where they exist and pass the self-test."""
    try:
        from torch._C._dynamo.guards import TensorGuards
    except Exception:  # noqa: BLE001 - any failure means: no guards
        return None
    return TensorGuards if _passes_self_test(lambda probe: _guard_of(probe, TensorGuards)) \
        else None


def _passes_self_test(make: Callable[[tuple], Callable[..., bool]]) -> bool:
    """Whether ``make((t,))`` takes a tensor of t's layout and refuses every other layout."""
    try:
        import torch
        check = make((torch.empty(2, 3),))
        return check(torch.empty(2, 3)) and not any(check(o) for o in (
            torch.empty(3, 2), torch.empty(2, 3).as_strided((2, 3), (1, 2)),
            torch.empty(2, 3, dtype=torch.float64), torch.empty(2, 4)[:, :3]))
    except Exception:  # noqa: BLE001 - any failure means: not this guard
        return False


def _scalars_told_apart(check_type: Any) -> bool:
    """Whether the C guard over a tensor and a scalar refuses another value or type of scalar
    and another number of arguments."""
    try:
        import torch
        t = torch.empty(2)
        check = check_type((t, 2), (0,), (1,))
        return check(t, 2) and not any(check(t, o) for o in (3, 2.0, True)) and \
            not check(t) and not check(t, 2, 2)
    except Exception:  # noqa: BLE001 - any failure means: not this guard
        return False


def kind() -> str:
    """Which guard the hot path uses here: ``C``, ``torch`` or ``none``."""
    return "C" if native_guard() is not None else "torch" if _torch_guards() is not None else "none"


def native_status() -> str:
    """Whether the C hot path is in use here and, if not, why and what to do (for doctor)."""
    if native_guard() is not None:
        return "C (ctbuild.serve._fast_path)"
    fallback = "Python with torch's guards" if _torch_guards() is not None else \
        "Python, keys only (no torch guards)"
    if _turned_off():
        why = "the C module is turned off (CTBUILD_NATIVE_GUARD=0)"
    else:
        try:
            from . import _fast_path  # noqa: F401
            why = "this torch exports no DLPack C exchange API (torch 2.11 or later does)"
        except ImportError:
            why = ("the C module is not built: reinstall ctbuild where a C compiler and "
                   "Python's headers are installed (e.g. gcc, python3-dev)")
    return f"{fallback}; {why}"


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


def make_guard(args: tuple, plan: GuardPlan) -> Guard:
    """The guard of calls with exactly the layout of ``args``: ``(guard, ())`` where one call
    ``guard(*args)`` checks them all, ``(guard, scalars)`` where ``guard(*tensors)`` checks
    the tensors at the plan's positions and the hot path compares the scalars (type, value
    per scalar position), ``(never, ())`` where no guard can be built."""
    native = native_guard()
    if native is not None:
        try:
            return native(args, *plan), ()
        except Exception:  # noqa: BLE001 - a tensor DLPack cannot describe: torch's guards
            pass
    guards = _torch_guards()
    try:
        return _guard_of(tuple(args[i] for i in plan[0]), guards), _scalars_of(args, plan)
    except Exception:  # noqa: BLE001 - a tensor the guards cannot take: keys only
        return never, ()


def _scalars_of(args: tuple, plan: GuardPlan) -> tuple:
    out: list[Any] = []
    for i in plan[1]:
        out += (type(args[i]), args[i])
    return tuple(out)


def _guard_of(tensors: tuple, guards: Any) -> Callable[..., bool]:
    return guards(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
                  dynamic_dims_strides=[list(t.stride()) for t in tensors]).check
