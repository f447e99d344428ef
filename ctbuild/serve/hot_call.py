"""The hot path's code, generated per argument kinds (as a JIT's launcher is per signature).

Where the C module is built (`_fast_path`, see `layout_guard`), a guarded entry's own code is
a C object doing what ``_ARMED`` below does: a warm call then runs no Python frame of ours at
all, about half the host cost of the Python code. Everything else is the Python code here.

A warm call costs one frame here. Where the kinds of arguments allow a layout guard
(`layout_guard`), the kernel's calls go straight to the functions of the entry it served last
(`HotPath.arm`): its guard, grid, served kernel, constant tail, device and scalar values are
closure constants, so a call that repeats that layout costs one C guard call and the launch,
no attribute or memo lookup. A call the guard refuses builds its key inline, looks it up and
routes the kernel to the entry it found (`KernelRuntime.switch`). Without a guard the kernel's
calls build the key every time. Written as ordinary methods the same work took four frames and
a call to a separate key function, about 0.4 us more per call; reading the last entry from the
runtime cost another 0.1 us. Everything uncommon goes back to the runtime's methods:

- keywords -> ``rt.with_keywords`` (binds them, then calls this again),
- no entry, or arguments of other kinds -> ``rt._first_call`` (the slow path),
- an entry's guard refusing a call its key matches -> ``rt.reguard`` (a few times),
- an entry that zeroes arguments or rebuilds kernel arguments -> ``rt.launch_entry``,
- any launch error (`served_kernel.LayoutChanged` included) -> ``rt.launch_failed``.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import cuda.tile as ct

from .layout_guard import GuardPlan, native_call, native_guard, never
from .live_args import key_expression
from .streams import raw_stream_getter

if TYPE_CHECKING:
    from .entry import Entry
    from .kernel_runtime import KernelRuntime

#: ``(call(*args, **kwargs), launch(stream, *args, **kwargs))``
Calls = tuple[Callable[..., None], Callable[..., None]]

# Launching a found entry: the general form (entries that zero arguments or rebuild their
# kernel arguments go to the runtime).
_LAUNCH_FOUND = """\
    tail = entry.hot_tail
    if tail is None:
        return rt.launch_entry(entry, {stream}, args)
    entry.calls += 1
    try:
        ct_launch({stream_expr}, entry.grid, entry.kernel, args + tail)
    except Exception as exc:
        entry.calls -= 1
        rt.launch_failed(exc, entry, {stream}, args)
"""

# Keys only: every call builds its key.
_KEYED = '''
def hot_{kind}({stream_param}*args, **kwargs):
    if kwargs:
        return rt.with_keywords({stream}, args, kwargs)
    try:
        [{params}] = args
        entry = rt._fast[{key}]
    except Exception:  # a new layout (KeyError) or other argument kinds: the slow path
        return rt._first_call({stream}, args)
''' + _LAUNCH_FOUND

# Guarded: a call an entry's guard refused (``last``; None before any entry) is keyed, and
# the kernel is routed to the entry its key finds. The memo is read once, before the lookup
# (`KernelRuntime.switch` says why).
_SWITCH = '''
def switch_{kind}({stream_param}args, last):
    try:
        [{params}] = args
        memo = rt._fast
        entry = memo[{key}]
    except Exception:  # a new layout (KeyError) or other argument kinds: the slow path
        return rt._first_call({stream}, args)
    if entry is not last:
        rt.switch(entry, memo)
    elif entry.guard is not never:
        rt.reguard(entry, args, memo)
''' + _LAUNCH_FOUND + '''
def hot_{kind}({stream_param}*args, **kwargs):
    if kwargs:
        return rt.with_keywords({stream}, args, kwargs)
    return switch_{kind}({stream_arg}args, None)
'''

# One entry's functions: everything they launch with is a closure constant.
_ARMED = '''
    def {kind}({stream_param}*args, **kwargs):
        if kwargs:
            return rt.with_keywords({stream}, args, kwargs)
        try:
            {unpack}hit = {test}
        except Exception:  # other argument kinds
            hit = False
        if not hit:
            return switch_{kind}({stream_arg}args, entry)
{launch}'''

_ARMED_LAUNCH = {
    "tail": """\
        entry.calls += 1
        try:
            ct_launch({stream_expr}, grid, kernel, args{plus_tail})
        except Exception as exc:
            entry.calls -= 1
            rt.launch_failed(exc, entry, {stream}, args)
""",
    "runtime": """\
        rt.launch_entry(entry, {stream}, args)
""",
}

_KINDS = (("call", "", "None", ""), ("launch", "stream, ", "stream", "stream, "))


class HotPath:
    """The generated code for calls with one set of argument kinds: ``call`` and ``launch``
    (what a kernel with no current entry runs) and, with a guard plan, `arm`."""

    def __init__(self, rt: KernelRuntime, args: tuple, with_device: bool, level: str,
                 guard: GuardPlan | None) -> None:
        params, key, namespace = key_expression(args, with_device, level)
        namespace.update(rt=rt, ct_launch=ct.launch, never=never)
        self._namespace, self._plan = namespace, guard
        self._factories: dict[tuple[str, bool, bool], Callable[..., Calls]] = {}
        template = _KEYED if guard is None else _SWITCH
        source = "".join(template.format(kind=kind, stream_param=param, stream=stream,
                                         stream_arg=arg, params=params, key=key,
                                         stream_expr=_stream_expr(stream, "entry.device"))
                         for kind, param, stream, arg in _KINDS)
        exec(compile(source, f"<ctbuild hot path of {rt.name}>", "exec"), namespace)
        self.call: Callable[..., None] = namespace["hot_call"]
        self.launch: Callable[..., None] = namespace["hot_launch"]

    @property
    def guarded(self) -> bool:
        return self._plan is not None

    def arm(self, entry: Entry, stream_of: Callable[[int], Any]) -> None:
        """Give ``entry`` its own ``call`` and ``launch`` (guarded plans only): its guard and
        scalar values decide whether a call is its own, then it launches with its constants
        on the stream ``stream_of(device)`` gives. Where the C guard checks the whole call,
        they are C objects (`_fast_path.ArmedCall`, the same steps as ``_ARMED``)."""
        assert self._plan is not None
        if entry.hot_tail is not None and not entry.scalars and native_call() is not None \
                and type(entry.guard) is native_guard() and self._arm_native(entry, stream_of):
            return
        tail = entry.hot_tail
        form = ("runtime" if tail is None else "tail", bool(tail), bool(entry.scalars))
        make = self._factories.get(form)
        if make is None:
            make = self._factories[form] = self._factory(*form)
        entry.call, entry.launch = make(entry, entry.guard, entry.grid, entry.kernel, tail,
                                        entry.device, stream_of, *entry.scalars)

    def _arm_native(self, entry: Entry, stream_of: Callable[[int], Any]) -> bool:
        """Arm ``entry`` with C call objects; False where they cannot be made for it."""
        ns, armed = self._namespace, native_call()
        # torch's raw getter is what the exchange table's current stream gives, minus a call.
        getter = None if stream_of is raw_stream_getter() else stream_of
        try:
            call, launch = (armed(
                entry, entry.guard, entry.grid, entry.kernel, entry.hot_tail, entry.device,
                getter, ns["ct_launch"], ns[f"switch_{kind}"], ns["rt"].with_keywords,
                ns["rt"].launch_failed, kind == "launch") for kind in ("call", "launch"))
        except (TypeError, ValueError, OverflowError):  # a device it cannot take: Python code
            return False
        entry.call, entry.launch = call, launch
        entry.armed += (call, launch)
        return True

    def _factory(self, shape: str, with_tail: bool, own_scalars: bool) -> Callable[..., Calls]:
        """The code of entries of one form: ``own_scalars`` where the guard checks the
        tensors only and the scalars are compared here (`layout_guard.make_guard`)."""
        tensors, scalars = self._plan or ((), ())
        n = len(tensors) + len(scalars)
        if own_scalars:
            unpack = f"[{', '.join(f'a{i}' for i in range(n))}] = args\n            "
            test = f"guard({', '.join(f'a{i}' for i in tensors)})" + "".join(
                f" and type(a{i}) is t{i} and a{i} == v{i}" for i in scalars)
        else:
            unpack, test = "", "guard(*args)"
        body = "".join(_ARMED.format(
            kind=kind, stream_param=param, stream=stream, stream_arg=arg, unpack=unpack,
            test=test, launch=_ARMED_LAUNCH[shape].format(
                stream=stream, stream_expr=_stream_expr(stream, "device", "stream_of"),
                plus_tail=" + tail" if with_tail else ""))
            for kind, param, stream, arg in _KINDS)
        consts = "".join(f", t{i}, v{i}" for i in scalars) if own_scalars else ""
        source = (f"def arm(entry, guard, grid, kernel, tail, device, stream_of{consts}):\n"
                  f"{body}\n    return call, launch\n")
        exec(compile(source, "<ctbuild hot path entry>", "exec"), self._namespace)
        return self._namespace.pop("arm")


def _stream_expr(stream: str, device: str, getter: str = "rt._stream_of") -> str:
    return f"{getter}({device})" if stream == "None" else stream
