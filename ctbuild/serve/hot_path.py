"""The hot path: a warm call's code, in one form per implementation, and where calls go.

``kernel(...)`` and ``kernel.launch(stream, ...)`` call the runtime's current ``call`` and
``launch`` directly (`TunedKernel` hands them over with no frame of its own). They are one of:

- **C** (`_fast_path.HotCall`, where the C module is built and passes its self-test,
  `layout_guard`): the kernel's entries sit in a `_fast_path.Table` by exact layout (each
  tensor's type, device, dtype, sizes and strides; each scalar's type and value). A call hashes
  its layout, finds its entry and launches it: one lookup whatever the call before was, so a
  serving loop whose batch or token count changes every call pays what a repeated size pays.
  No Python frame of ours runs.
- **Python** (`python_forms`), everywhere else: the call's key (`live_args.make_key_fn`: per
  tensor what the declared functions read) is compared with the key of the entry it served
  last, else finds its entry in the memo; the entry is launched. Plain closures, no generated
  code; the key's attribute reads (about 0.14 us per tensor on a CPU where the C form's whole
  call costs 0.13 us) are most of its time.

Where calls go when they are not a plain warm call:

- keywords -> ``rt.with_keywords`` (binds them, then calls the form again);
- C, no entry of this exact layout -> ``rt.table_miss``: the key finds the entry (another exact
  layout of one key, e.g. the strides of a size-1 dim: added to the table), else the slow path;
- Python, no entry or arguments of other kinds -> ``rt._first_call`` (the slow path);
- an entry that zeroes arguments or rebuilds its kernel arguments -> ``rt.launch_entry``;
- any launch error (`served_kernel.LayoutChanged` included) -> ``rt.launch_failed``.

The C form serves keys of the levels ``contiguity`` and ``layout`` (an exact layout decides
more than either; `declaration_reads.KEY_LEVELS`); where pointers matter (``alignment``,
``address``) the runtime uses the Python form.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import cuda.tile as ct

from .streams import raw_stream_getter

if TYPE_CHECKING:
    from .kernel_runtime import KernelRuntime

#: ``(call(*args, **kwargs), launch(stream, *args, **kwargs))``
Calls = tuple[Callable[..., None], Callable[..., None]]


def c_forms(rt: KernelRuntime, table: Any, stream_of: Callable[[int], Any]) -> Calls | None:
    """The C form over ``table``; None where it cannot be made (no tensor type to read the
    current stream through: then the Python form serves)."""
    from ._fast_path import HotCall
    # torch's raw getter is what the exchange table's current stream gives, minus a call.
    getter = None if stream_of is raw_stream_getter() else stream_of
    try:
        call, launch = (HotCall(table, getter, ct.launch, rt.table_miss, rt.with_keywords,
                                rt.launch_failed, rt.launch_entry, with_stream)
                        for with_stream in (False, True))
    except ValueError:
        return None
    return call, launch


class _NoEntry:
    """What the Python form's last entry is before its first call: no key equals its key."""
    key = None


def python_forms(rt: KernelRuntime) -> Calls:
    """The plain Python form: key, memo, launch (see the module doc). Built for the host time
    of a warm call, which the key's reads (three tensor attributes per tensor) dominate:

    - the entry served last is asked first: a call whose key equals its key (a loop calling
      one layout, every layer of a model calling its norm with one shape) skips hashing the
      key and the memo lookup; any other call looks its key up and becomes the last;
    - one frame of ours per call besides the key function's: ``call`` and ``launch`` each do
      it all (a shared inner function costs a frame per call, a tenth of the form's time);
    - the key function, the stream getter and cuTile's launch are bound here, not looked up
      per call: the runtime makes its form again when any of them changes, and when the memo
      is dropped (`KernelRuntime._retire`), so that no dropped entry is served from here.
    """
    key, stream_of, launch_fn = rt._key, rt._stream_of, ct.launch
    last: Any = _NoEntry  # read and replaced whole: each thread compares its key with its key

    def call(*args: Any, **kwargs: Any) -> None:
        nonlocal last
        if kwargs:
            return rt.with_keywords(None, args, kwargs)
        try:
            k = key(*args)
            entry = last
            if k != entry.key:
                entry = last = rt._fast[k]
        except Exception:  # a new layout (KeyError) or other argument kinds: the slow path
            return rt._first_call(None, args)
        tail = entry.hot_tail
        if tail is None:
            return rt.launch_entry(entry, None, args)
        entry.calls += 1
        try:
            launch_fn(stream_of(entry.device), entry.grid, entry.kernel, args + tail)
        except Exception as exc:
            entry.calls -= 1
            rt.launch_failed(exc, entry, None, args)

    def launch(stream: Any, *args: Any, **kwargs: Any) -> None:
        nonlocal last
        if kwargs:
            return rt.with_keywords(stream, args, kwargs)
        try:
            k = key(*args)
            entry = last
            if k != entry.key:
                entry = last = rt._fast[k]
        except Exception:
            return rt._first_call(stream, args)
        tail = entry.hot_tail
        if tail is None:
            return rt.launch_entry(entry, stream, args)
        entry.calls += 1
        try:
            launch_fn(stream_of(entry.device) if stream is None else stream, entry.grid,
                      entry.kernel, args + tail)
        except Exception as exc:
            entry.calls -= 1
            rt.launch_failed(exc, entry, stream, args)

    return call, launch
