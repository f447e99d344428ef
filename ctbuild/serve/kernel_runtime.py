"""The hot path: launch a declared kernel warm from the cache.

``matmul(a, b, c)`` (current torch stream) or ``matmul.launch(stream, a, b, c)`` runs code
generated for the call's argument kinds (`hot_call`): the functions of the entry served last,
which ask whether the call has exactly its layout (`layout_guard`, one C call) and launch it;
if not, one flat key of the call (`live_args.key_expression`), inline, looks up an `Entry`,
which is launched and serves the next call first. No Workload, no declared key/grid/args
function, no cache access, no lock.

The key holds per tensor what the kernel's declared functions read of it (`declaration_reads`:
for most, shape, dtype and contiguity; strides when they read strides), per scalar its type
and value. What else decides the launch -- strides and the base pointers' alignment, through
cuTile's signature -- is guarded by the entry's served kernel, pinned to the one signature it
first served: a call whose signature differs raises `LayoutChanged` before anything launches,
and from then on the kernel's keys hold strides and pointer % 16 too (`KEY_LEVELS`).

A call without an entry takes the slow path under the kernel's lock: `resolve` (winner, CUBIN,
grid, arguments; the miss policy on a miss), then `_launch` (the general form of the hot
path's launch), then the entry is published. Importing this module imports neither Ray nor the
farm.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import cuda.tile as ct

from . import provenance
from .context import RuntimeContext, configure, context, reset, stats
from .declaration_reads import KEY_LEVELS
from .entry import Entry
from .errors import KernelCallError, reraise_named
from .hot_call import HotPath
from .layout_guard import MAX_REGUARDS, GuardPlan, guard_plan, make_guard, never
from .live_args import make_key_fn
from .miss_policy import CacheMissError, RuntimeConfigError
from .resolve import Resolved, Resolver, explanation
from .served_kernel import LayoutChanged, ServedKernel
from .streams import (
    current_stream_getter,
    current_stream_object,
    refuses_stream,
    visible_gpus,
    zero_args,
)

if TYPE_CHECKING:
    from ..declare import TunedKernel
    from ..space import Config

__all__ = ["KernelRuntime", "RuntimeContext", "CacheMissError", "KernelCallError",
           "RuntimeConfigError", "configure", "context", "reset", "stats"]

#: Drop the hot-path memo (and fold its provenance rows into totals) of a kernel when it grows
#: past this (e.g. a scalar that varies).
MAX_FAST_ENTRIES = 4096


def _no_key(*args: Any) -> tuple:
    raise KeyError("no key function yet")


class KernelRuntime:
    """Launches one declared kernel warm from the cache."""

    def __init__(self, tuned: TunedKernel, ctx: RuntimeContext | None = None) -> None:
        self.tuned, self.name = tuned, tuned.name
        self.ctx = ctx or context(near=tuned.folder)
        self.resolver = Resolver(tuned, self.ctx)
        self._lock = self.resolver.lock
        self._fast: dict[tuple, Entry] = {}  # the hot-path memo: key -> entry
        self._hot: HotPath | None = None  # the code serving calls of the memo's kinds
        self._guard: GuardPlan | None = None  # how that code guards entries (None: no)
        self._entries: list[Entry] = []
        self._retired: Counter = Counter()  # provenance totals of rows `_retire` dropped
        self._zero_idx = tuple(tuned.params.index(n) for n in tuned.reset_to_zero)
        self._stream_of = current_stream_getter()
        self._multi_gpu = visible_gpus() != 1
        self._key: Any = _no_key
        self._keys = KEY_LEVELS[0]  # what keys hold: `declaration_reads.KEY_LEVELS`
        #: ``kernel(*args, **kwargs)`` and ``kernel.launch(stream, ...)`` while no entry
        #: serves them (the kernel calls those of its current entry directly): the slow path
        #: until a call is keyed, then code generated for the arguments' kinds (`hot_call`).
        self.call: Callable[..., None] = self._call_first
        self.launch: Callable[..., None] = self._launch_first

    def __repr__(self) -> str:
        return f"<KernelRuntime {self.name} mode={self.ctx.mode} entries={len(self._entries)}>"

    def _call_first(self, *args: Any, **kwargs: Any) -> None:
        """``call`` before any call was keyed: the slow path."""
        self.with_keywords(None, args, kwargs) if kwargs else self._first_call(None, args)

    def _launch_first(self, stream: Any, *args: Any, **kwargs: Any) -> None:
        """``launch`` before any call was keyed: the slow path."""
        self.with_keywords(stream, args, kwargs) if kwargs else self._first_call(stream, args)

    def switch(self, entry: Entry, memo: dict) -> None:
        """Route the kernel's calls to ``entry``'s functions, found in ``memo``.

        No lock: when the memo started over meanwhile (``memo`` is not the runtime's any
        more), the kernel is routed back to the runtime's functions. `_new_memo` sets those
        before the new memo and routes to them after it, so whichever route comes last, the
        kernel never stays with an entry of a dropped memo (which would launch correctly but
        count its calls nowhere)."""
        call, launch = entry.call, entry.launch
        assert call is not None and launch is not None  # only armed entries are switched to
        self.tuned.route(self, call, launch)
        if self._fast is not memo:
            self.tuned.route(self, self.call, self.launch)

    def with_keywords(self, stream: Any, args: tuple, kwargs: dict) -> None:
        """A call with keyword arguments: bind them to positions, then the hot path."""
        w = self.tuned.bind(*args, **kwargs)
        args = tuple(w.args[p] for p in self.tuned.params)
        self.call(*args) if stream is None else self.launch(stream, *args)

    def launch_entry(self, entry: Entry, stream: Any, args: tuple) -> None:
        """`_launch` for the hot path, which leaves it the entries that zero arguments or
        rebuild kernel arguments."""
        try:
            self._launch(entry, stream, args)
        except LayoutChanged:
            self._first_call(stream, args, keys="alignment")

    def launch_failed(self, exc: Exception, entry: Entry, stream: Any, args: tuple) -> None:
        """A hot-path launch raised: a layout its pinned kernel refuses takes the slow path
        with alignment-holding keys; a cuTile refusing raw stream handles gets torch streams
        from now on (an entry armed before that switch lands here too); anything else is
        raised naming the kernel."""
        if type(exc) is LayoutChanged:
            return self._first_call(stream, args, keys="alignment")
        if stream is None and refuses_stream(exc):
            self._use_stream_objects()
            return self.launch_entry(entry, stream, args)
        reraise_named(exc, self.tuned)

    def reguard(self, entry: Entry, args: tuple, memo: dict) -> None:
        """The hot path found ``entry`` in ``memo`` by its key after its guard refused the
        call (same key, other strides of a size-1 dim, say, or another ``inference_mode``):
        guard it with this call's layout, a few times at most
        (`layout_guard.MAX_REGUARDS`), and let it serve the next call first again."""
        entry.reguards += 1
        plan = self._guard
        entry.guard, entry.scalars = make_guard(args, plan) if plan is not None and \
            entry.reguards <= MAX_REGUARDS else (never, ())
        self._arm(entry)
        self.switch(entry, memo)

    def _arm(self, entry: Entry) -> None:
        """Give ``entry`` its own functions where the hot path guards entries."""
        if self._hot is not None and self._hot.guarded:
            self._hot.arm(entry, self._stream_of)

    def _raw_stream_refused(self, exc: Exception, stream: Any) -> bool:
        """Whether a launch on the current stream failed because cuTile takes no raw stream
        handle; if so, the runtime passes torch stream objects from now on."""
        return stream is None and refuses_stream(exc) and self._use_stream_objects()

    def _use_stream_objects(self) -> bool:
        """Launch on torch stream objects from now on: entries are armed again with them, and
        the kernel's calls go to the runtime's functions until one is served. False when it
        already did (nothing changes)."""
        if self._stream_of is current_stream_object:
            return False
        self._stream_of = current_stream_object
        for entry in list(self._fast.values()):
            self._arm(entry)
        self.tuned.route(self, self.call, self.launch)
        return True

    def _launch(self, entry: Entry, stream: Any, args: tuple) -> None:
        """The general launch (the hot path's template inlines its common case): zero the
        ``reset_to_zero`` arguments, pick the stream, build the kernel arguments, launch; an
        error names the kernel. `LayoutChanged` (the call's signature is not its entry's;
        nothing launched) is the caller's to handle."""
        entry.calls += 1
        try:
            if entry.zero:
                zero_args(stream, args, entry.zero)
            ct.launch(self._stream_of(entry.device) if stream is None else stream, entry.grid,
                      entry.kernel, entry.build(args))
        except Exception as exc:
            entry.calls -= 1
            if type(exc) is LayoutChanged:
                raise
            if self._raw_stream_refused(exc, stream):
                return self._launch(entry, stream, args)
            reraise_named(exc, self.tuned)

    def _first_call(self, stream: Any, args: tuple, keys: str = KEY_LEVELS[0]) -> None:
        """The slow path: resolve the call, launch it with `_launch`, publish its entry
        (``keys="alignment"``: after a `LayoutChanged`, keys hold pointer alignments first)."""
        with self._lock:
            self._key_at_least(keys)
            try:
                return self._resolve_and_launch(stream, args)
            except LayoutChanged:  # a pinned kernel shared by a signature derived differently
                self._key_at_least("alignment")
                return self._resolve_and_launch(stream, args)

    def _resolve_and_launch(self, stream: Any, args: tuple) -> None:
        key = self._memo_key(args)
        entry = self._fast.get(key) if key is not None else None
        if entry is not None:  # another thread resolved this layout while we waited
            if entry.call is not None:
                self.switch(entry, self._fast)
            return self._launch(entry, stream, args)
        try:
            res = self.resolver.resolve(args, stream=stream)
        except Exception as exc:
            reraise_named(exc, self.tuned)
        need = res.keys_needed if res.signature is not None else \
            max(res.keys_needed, "alignment", key=KEY_LEVELS.index)
        if self._key_at_least(need):
            key = self._memo_key(args)
        served = res.served
        if res.signature is not None and KEY_LEVELS.index(self._keys) < \
                KEY_LEVELS.index("alignment"):  # keys without alignment: pin the signature
            served = self.resolver.pinned_kernel(res.config, res.signature)
        entry = Entry(res.grid, served, args, res.kernel_args,
                      partial(_kernel_args, self.tuned, res.config), res.device,
                      self._zero_idx)
        with self.ctx.policy.first_launch(self.name, res.workload_json, res.arch,
                                          res.cubin_from, res.cubin_class) as launched:
            self._launch(entry, stream, args)
        entry.info = provenance.describe(res, launched.cubin_from, launched.cubin_class)
        if key is not None:
            if len(self._fast) >= MAX_FAST_ENTRIES:
                self._retire()
            if self._guard is not None:
                entry.guard, entry.scalars = make_guard(args, self._guard)
                self._arm(entry)
            self._fast[key] = entry
            if entry.call is not None:
                self.switch(entry, self._fast)
        self._entries.append(entry)

    def _retire(self) -> None:
        """Drop the hot-path memo and fold its provenance rows into totals: a scalar argument
        that varies without bound must not grow memory."""
        self._retired += provenance.totals(self._entries)
        self._retired["rows", "dropped"] += len(self._entries)
        self._entries = []
        self._new_memo(self._hot)

    def _new_memo(self, hot: HotPath | None) -> None:
        """The hot-path memo starts over, its calls served by ``hot`` (None: the slow path
        until a call is keyed). In this order: the runtime's functions, the empty memo, the
        kernel's route (`switch` relies on it)."""
        self._hot = hot
        self.call, self.launch = (hot.call, hot.launch) if hot is not None else \
            (self._call_first, self._launch_first)
        self._fast = {}
        self.tuned.route(self, self.call, self.launch)

    def _key_at_least(self, keys: str) -> bool:
        """From now on keys hold at least what ``keys`` names; when that is more than they
        held, the memo starts over and this returns True."""
        if KEY_LEVELS.index(keys) <= KEY_LEVELS.index(self._keys):
            return False
        self._keys, self._key, self._guard = keys, _no_key, None
        self._new_memo(None)
        return True

    def _memo_key(self, args: tuple) -> tuple | None:
        """The hot-path key of a call; rebuilds the key function when the argument kinds
        changed (then the memo starts over). None when the call cannot be keyed."""
        try:
            return self._key(*args)
        except Exception:
            pass
        try:
            key_fn = make_key_fn(args, with_device=self._multi_gpu, level=self._keys)
            key = key_fn(*args)
            hash(key)
        except Exception:
            return None
        self._key = key_fn
        # Exact sizes and strides decide more than keys of these levels; the weaker ones
        # (alignment, address) are not guarded.
        self._guard = guard_plan(args) if self._keys in KEY_LEVELS[:2] else None
        self._new_memo(HotPath(self, args, self._multi_gpu, self._keys, self._guard))
        return key

    # ---- resolution and reports (not on the hot path) ----
    def resolve(self, args: tuple, kwargs: dict | None = None, **how: Any) -> Resolved:
        """`Resolver.resolve`: what a call launches, without launching it."""
        return self.resolver.resolve(args, kwargs, **how)

    def explain(self, args: tuple, kwargs: dict | None = None, *, arch: str | None = None,
                gpu: str | None = None) -> dict[str, Any]:
        """`TunedKernel.explain`: what `resolve` decides for a call, as a dict, launching
        nothing, counting and recording nothing."""
        res = self.resolver.resolve(args, kwargs, arch=arch, gpu=gpu, dry=True)
        out = explanation(res, self.name, self.ctx.mode)
        out["cache"] = self.ctx.cache
        if res.cubin_class == "miss" or res.config_from == "default":
            from ..miss_reasons import explain_gaps
            assert res.spec is not None
            out.update(explain_gaps(self.tuned.declared_workloads, res.spec,
                                    self.tuned.constant_args(res.workload),
                                    cubin_miss=res.cubin_class == "miss", arch=res.arch,
                                    cache_problem=self.ctx.cache_problem))
        return out

    def served_kernel(self, cfg: Config) -> ServedKernel:
        return self.resolver.served_kernel(cfg)

    def provenance(self) -> dict[str, Any]:
        """Where this kernel's launches came from: counts by origin and per resolved call."""
        return provenance.summary(self.name, self.ctx.mode, list(self._entries),
                                  self.ctx.misses.total(self.name), self.resolver.kernel_objects(),
                                  self._keys, self._retired)


def _kernel_args(tuned: TunedKernel, cfg: Config, args: tuple) -> tuple:
    """The kernel arguments of a call whose layout has no recipe (the args function runs)."""
    return tuned.kernel_args(cfg, tuned.bind(*args))
