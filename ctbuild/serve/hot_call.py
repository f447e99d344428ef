"""The hot path's code, generated per argument kinds (as a JIT's launcher is per signature).

A warm call costs one frame here: unpack the arguments, find the entry, launch. The entry is
found by asking the one served last whether the call has its layout (`layout_guard`: one C
call, where the kinds of arguments allow it), else by building the key inline and looking it
up. Written as ordinary methods the same work took four frames and a call to a separate key
function, about 0.4 us more per call, which is most of the budget. The template is the whole
hot path; everything uncommon goes back to the runtime's methods:

- keywords -> ``rt.with_keywords`` (binds them, then calls this again),
- no entry, or arguments of other kinds -> ``rt._first_call`` (the slow path),
- the last entry's guard refusing a call its key matches -> ``rt.reguard`` (a few times),
- an entry that zeroes arguments or rebuilds kernel arguments -> ``rt.launch_entry``,
- any launch error (`served_kernel.LayoutChanged` included) -> ``rt.launch_failed``.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import cuda.tile as ct

from .layout_guard import GuardPlan, never
from .live_args import key_expression

if TYPE_CHECKING:
    from .kernel_runtime import KernelRuntime

_TEMPLATE = '''
def {name}({stream_param}*args, **kwargs):
    if kwargs:
        return rt.with_keywords({stream}, args, kwargs)
    try:
{lookup}
    except Exception:  # a new layout (KeyError) or other argument kinds: the slow path
        return rt._first_call({stream}, args)
    tail = entry.hot_tail
    if tail is None:
        return rt.launch_entry(entry, {stream}, args)
    entry.calls += 1
    try:
        ct_launch({stream_expr}, entry.grid, entry.kernel, args + tail)
    except Exception as exc:
        entry.calls -= 1
        rt.launch_failed(exc, entry, {stream}, args)
'''


_LOOKUP = """\
        [{params}] = args
        entry = rt._fast[{key}]"""

# With scalars the arguments are unpacked first (the test compares them); with tensors only
# the guard takes the arguments' tuple as it is, and only the key needs them unpacked. The
# last entry's cell is read before the memo (`entry.LastEntry` says why).
_GUARDED_LOOKUP = """\
        {unpack_first}cell = rt._last
        last = cell.entry
        if {test}:
            entry = last
        else:
            {unpack_then}entry = rt._fast[{key}]
            if entry is not last:
                cell.entry = entry
            elif last.guard is not never:
                rt.reguard(entry, args)"""


def hot_calls(rt: KernelRuntime, args: tuple, with_device: bool, level: str,
              guard: GuardPlan | None
              ) -> tuple[Callable[..., None], Callable[..., None]]:
    """``(call(*args, **kwargs), launch(stream, *args, **kwargs))`` for calls with the kinds of
    ``args``, keyed as `live_args.key_expression` says; with a ``guard`` plan (tensor and
    scalar positions), the entry served last is asked first."""
    params, key, namespace = key_expression(args, with_device, level)
    namespace.update(rt=rt, ct_launch=ct.launch, never=never)
    unpack = f"[{params}] = args"
    if guard is None:
        lookup = _LOOKUP.format(params=params, key=key)
    else:
        tensors, scalars = guard
        if scalars:
            pairs = ", ".join(f"type(a{i}), a{i}" for i in scalars)
            test = f"last.guard({', '.join(f'a{i}' for i in tensors)}) and " \
                f"({pairs}) == last.scalars"
            first, then = unpack + "\n        ", ""
        else:
            test, first, then = "last.guard(*args)", "", unpack + "\n            "
        lookup = _GUARDED_LOOKUP.format(unpack_first=first, unpack_then=then, test=test,
                                        key=key)
    source = _TEMPLATE.format(name="hot_call", stream_param="", stream="None",
                              stream_expr="rt._stream_of(entry.device)", lookup=lookup) + \
        _TEMPLATE.format(name="hot_launch", stream_param="stream, ", stream="stream",
                         stream_expr="stream", lookup=lookup)
    exec(compile(source, f"<ctbuild hot path of {rt.name}>", "exec"), namespace)
    return namespace["hot_call"], namespace["hot_launch"]
