"""The hot path: launch a declared kernel warm from the cache.

``matmul(a, b, c)`` (current torch stream) or ``matmul.launch(stream, a, b, c)``: one flat key
of the call (per tensor: shape, strides, dtype, pointer % 16, and the device when several GPUs
are visible; per scalar: type and value), computed by a function generated for the call's
argument kinds (`live_args.make_key_fn`), looks up an `Entry`, and `_launch` launches it. No
Workload, no declared key/grid/args function, no cache access, no lock.

A call without an entry takes the slow path under the kernel's lock: `resolve` (winner, CUBIN,
grid, arguments; the miss policy on a miss), then the same `_launch`, then the entry is
published. Importing this module imports neither Ray nor the farm.
"""
from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import cuda.tile as ct

from . import provenance
from .context import RuntimeContext, configure, context, reset, stats
from .entry import Entry
from .errors import KernelCallError, reraise_named
from .live_args import make_key_fn
from .miss_policy import CacheMissError, RuntimeConfigError
from .resolve import Resolved, Resolver, explanation
from .served_kernel import ServedKernel
from .streams import (
    current_stream_getter,
    current_stream_object,
    refuses_raw_stream,
    visible_gpus,
    zero_args,
)

if TYPE_CHECKING:
    from ..declare import TunedKernel
    from ..space import Config

__all__ = ["KernelRuntime", "RuntimeContext", "CacheMissError", "KernelCallError",
           "RuntimeConfigError", "configure", "context", "reset", "stats"]

#: Drop the hot-path memo of a kernel when it grows past this (e.g. a scalar that varies).
MAX_FAST_ENTRIES = 4096


def _no_key(*args: Any) -> tuple:
    raise KeyError("no key function yet")


class KernelRuntime:
    """Launches one declared kernel warm from the cache."""

    def __init__(self, tuned: TunedKernel, ctx: RuntimeContext | None = None) -> None:
        self.tuned, self.name = tuned, tuned.name
        self.ctx = ctx or context()
        self.resolver = Resolver(tuned, self.ctx)
        self._lock = self.resolver.lock
        self._fast: dict[tuple, Entry] = {}
        self._entries: list[Entry] = []
        self._zero_idx = tuple(tuned.params.index(n) for n in tuned.reset_to_zero)
        self._stream_of = current_stream_getter()
        self._multi_gpu = visible_gpus() != 1
        self._key: Any = _no_key

    def __repr__(self) -> str:
        return f"<KernelRuntime {self.name} mode={self.ctx.mode} entries={len(self._entries)}>"

    def call(self, args: tuple, kwargs: dict) -> None:
        """``kernel(*args, **kwargs)`` on the current torch stream of the tensors' device (the
        lookup of `launch`, spelled out: one Python call less on the hot path)."""
        if kwargs:
            args = self._positional(args, kwargs)
        try:
            entry = self._fast[self._key(*args)]
        except Exception:  # a new layout (KeyError) or other argument kinds: the slow path
            return self._first_call(None, args)
        self._launch(entry, None, args)

    def launch(self, stream: Any, args: tuple, kwargs: dict) -> None:
        """``kernel.launch(stream, *args, **kwargs)`` on an explicit stream."""
        if kwargs:
            args = self._positional(args, kwargs)
        try:
            entry = self._fast[self._key(*args)]
        except Exception:
            return self._first_call(stream, args)
        self._launch(entry, stream, args)

    def _launch(self, entry: Entry, stream: Any, args: tuple) -> None:
        """The one launch routine: zero the ``reset_to_zero`` arguments, pick the stream,
        build the kernel arguments, launch; an error names the kernel."""
        entry.calls += 1
        try:
            if entry.zero:
                zero_args(stream, args, entry.zero)
            tail = entry.tail
            ct.launch(self._stream_of(entry.device) if stream is None else stream, entry.grid,
                      entry.kernel, args + tail if tail is not None else entry.build(args))
        except Exception as exc:
            if stream is None and refuses_raw_stream(exc, self._stream_of):
                self._stream_of = current_stream_object  # from now on: torch stream objects
                entry.calls -= 1
                return self._launch(entry, stream, args)
            reraise_named(exc, self.tuned)

    def _first_call(self, stream: Any, args: tuple) -> None:
        """The slow path: resolve the call, launch it with `_launch`, publish its entry."""
        with self._lock:
            key = self._memo_key(args)
            entry = self._fast.get(key) if key is not None else None
            if entry is not None:  # another thread resolved this layout while we waited
                return self._launch(entry, stream, args)
            try:
                res = self.resolver.resolve(args, stream=stream)
            except Exception as exc:
                reraise_named(exc, self.tuned)
            entry = Entry(res.grid, res.served, args, res.kernel_args,
                          partial(_kernel_args, self.tuned, res.config), res.device,
                          self._zero_idx)
            with self.ctx.policy.first_launch(self.name, res.workload_json, res.arch,
                                              res.cubin_from, res.cubin_class) as launched:
                self._launch(entry, stream, args)
            entry.info = provenance.describe(res, launched.cubin_from, launched.cubin_class)
            self._entries.append(entry)
            if key is not None:
                if len(self._fast) >= MAX_FAST_ENTRIES:
                    self._fast = {}
                self._fast[key] = entry

    def _memo_key(self, args: tuple) -> tuple | None:
        """The hot-path key of a call; rebuilds the key function when the argument kinds
        changed (then the memo starts over). None when the call cannot be keyed."""
        try:
            return self._key(*args)
        except Exception:
            pass
        try:
            key_fn = make_key_fn(args, with_device=self._multi_gpu)
            key = key_fn(*args)
            hash(key)
        except Exception:
            return None
        self._key, self._fast = key_fn, {}
        return key

    def _positional(self, args: tuple, kwargs: dict) -> tuple:
        w = self.tuned.bind(*args, **kwargs)
        return tuple(w.args[p] for p in self.tuned.params)

    # ---- resolution and reports (not on the hot path) ----
    def resolve(self, args: tuple, kwargs: dict | None = None, **how: Any) -> Resolved:
        """`Resolver.resolve`: what a call launches, without launching it."""
        return self.resolver.resolve(args, kwargs, **how)

    def explain(self, args: tuple, kwargs: dict | None = None, *, arch: str | None = None,
                gpu: str | None = None) -> dict[str, Any]:
        """`TunedKernel.explain`: what `resolve` decides for a call, as a dict, launching
        nothing, counting and recording nothing."""
        res = self.resolver.resolve(args, kwargs, arch=arch, gpu=gpu, dry=True)
        return explanation(res, self.name, self.ctx.mode)

    def served_kernel(self, cfg: Config) -> ServedKernel:
        return self.resolver.served_kernel(cfg)

    def provenance(self) -> dict[str, Any]:
        """Where this kernel's launches came from: counts by origin and per resolved call."""
        return provenance.summary(self.name, self.ctx.mode, list(self._entries),
                                  self.ctx.misses.total(self.name), len(self.resolver.served))


def _kernel_args(tuned: TunedKernel, cfg: Config, args: tuple) -> tuple:
    """The kernel arguments of a call whose layout has no recipe (the args function runs)."""
    return tuned.kernel_args(cfg, tuned.bind(*args))
