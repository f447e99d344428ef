"""Whether the C hot path (`_fast_path`) is used here, and its layout tables.

The C module is built with the package where a C compiler and Python's headers are found. It
reads tensors through torch's DLPack C exchange API (torch 2.11 and later export it), needs no
torch headers, and is checked once per process before it is trusted (`native_guard`): a
`LayoutCheck` must accept a tensor of its own layout and refuse every other layout, scalar
value, scalar type and argument count. ``CTBUILD_NATIVE_GUARD=0`` turns it off. Where it is not
used the hot path is the plain Python form (`hot_path`).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from functools import cache
from typing import Any

#: Where a call's arguments are tensors and where plain scalars (a table's plan).
GuardPlan = tuple[tuple[int, ...], tuple[int, ...]]


@cache
def native_guard() -> Any:
    """The C layout check's type (`_fast_path.LayoutCheck`), where it was built, is not turned
    off and passes the self-test; else None."""
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
    """Whether the C check over a tensor and a scalar refuses another value or type of scalar
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
    """Which form the hot path takes here: ``C`` or ``Python``."""
    return "C" if native_guard() is not None else "Python"


def native_status() -> str:
    """Whether the C hot path is in use here and, if not, why and what to do (for doctor)."""
    if native_guard() is not None:
        return "C (ctbuild.serve._fast_path)"
    if _turned_off():
        why = "the C module is turned off (CTBUILD_NATIVE_GUARD=0)"
    else:
        try:
            from . import _fast_path  # noqa: F401
            why = "this torch exports no DLPack C exchange API (torch 2.11 or later does)"
        except ImportError:
            why = ("the C module is not built: reinstall ctbuild where a C compiler and "
                   "Python's headers are installed (e.g. gcc, python3-dev)")
    return f"Python (keys); {why}"


def guard_plan(args: tuple) -> GuardPlan | None:
    """Tensor and scalar positions of calls like ``args``, or None when the C form cannot
    cover them (not available, no tensor, or an argument that is neither a torch tensor nor a
    plain scalar)."""
    if native_guard() is None:
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


def new_table(args: tuple, plan: GuardPlan) -> Any:
    """A `_fast_path.Table` for calls of the kinds of ``args``; None where it cannot hold them
    (a tensor DLPack cannot describe, too many arguments)."""
    from ._fast_path import Table
    try:
        return Table(args, *plan)
    except (TypeError, ValueError, OverflowError, RuntimeError, BufferError):
        return None
