"""The hot path's code, generated per argument kinds (as a JIT's launcher is per signature).

A warm call costs one frame here: unpack the arguments, build the key inline, look the entry
up, launch. Written as ordinary methods the same work took four frames and a call to a
separate key function, about 0.4 us more per call, which is most of the budget. The template
is the whole hot path; everything uncommon goes back to the runtime's methods:

- keywords -> ``rt.with_keywords`` (binds them, then calls this again),
- no entry, or arguments of other kinds -> ``rt._first_call`` (the slow path),
- an entry that zeroes arguments or rebuilds kernel arguments -> ``rt.launch_entry``,
- any launch error (`served_kernel.LayoutChanged` included) -> ``rt.launch_failed``.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import cuda.tile as ct

from .live_args import key_expression

if TYPE_CHECKING:
    from .kernel_runtime import KernelRuntime

_TEMPLATE = '''
def {name}({stream_param}args, kwargs):
    if kwargs:
        return rt.with_keywords({stream}, args, kwargs)
    try:
        [{params}] = args
        entry = rt._fast[{key}]
    except Exception:  # a new layout (KeyError) or other argument kinds: the slow path
        return rt._first_call({stream}, args)
    tail = entry.tail
    if tail is None or entry.zero:
        return rt.launch_entry(entry, {stream}, args)
    entry.calls += 1
    try:
        ct_launch({stream_expr}, entry.grid, entry.kernel, args + tail)
    except Exception as exc:
        entry.calls -= 1
        rt.launch_failed(exc, entry, {stream}, args)
'''


def hot_calls(rt: KernelRuntime, args: tuple, with_device: bool, level: str
              ) -> tuple[Callable[[tuple, dict], None], Callable[[Any, tuple, dict], None]]:
    """``(call(args, kwargs), launch(stream, args, kwargs))`` for calls with the kinds of
    ``args``, keyed as `live_args.key_expression` says."""
    params, key, namespace = key_expression(args, with_device, level)
    namespace.update(rt=rt, ct_launch=ct.launch)
    source = _TEMPLATE.format(name="hot_call", stream_param="", stream="None",
                              stream_expr="rt._stream_of(entry.device)", params=params,
                              key=key) + \
        _TEMPLATE.format(name="hot_launch", stream_param="stream, ", stream="stream",
                         stream_expr="stream", params=params, key=key)
    exec(compile(source, f"<ctbuild hot path of {rt.name}>", "exec"), namespace)
    return namespace["hot_call"], namespace["hot_launch"]
