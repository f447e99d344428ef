"""A declared kernel's runtime: its entries, the slow path that makes them, and the routing.

``matmul(a, b, c)`` (current torch stream) or ``matmul.launch(stream, a, b, c)`` runs the hot
path's form for the call's argument kinds (`hot_path`, where its forms and routing are
documented): the C form finds the call's `Entry` by its exact layout in the kernel's table, the
Python form by one flat key of the call (`live_args.key_expression`); either launches it. No
Workload, no declared key/grid/args function, no cache access, no lock.

The key holds per tensor what the kernel's declared functions read of it (`declaration_reads`:
for most, shape, dtype and contiguity; strides when they read strides), per scalar its type
and value. What else decides the launch -- strides and the base pointers' alignment, through
cuTile's signature -- is guarded by the entry's served kernel, pinned to the one signature it
first served: a call whose signature differs raises `LayoutChanged` before anything launches,
and from then on the kernel's keys hold strides and pointer % 16 too (`KEY_LEVELS`).

A call without an entry takes the slow path under the kernel's lock: `resolve` (winner, CUBIN,
grid, arguments; the miss policy on a miss), then `_launch` (the general form of the hot
path's launch), then the entry is published in the memo and the table. Importing this module
imports neither Ray nor the farm.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import cuda.tile as ct

from ..cutile import load_module
from ..device_table import explain_device
from . import provenance
from .context import RuntimeContext, configure, context, reset, stats
from .declaration_reads import KEY_LEVELS
from .entry import Entry
from .errors import KernelCallError, reraise_named
from .hot_path import c_forms, python_forms
from .layout_guard import guard_plan, new_table
from .ledger import LEDGER
from .live_args import device_of, make_key_fn
from .miss_policy import CacheMissError, RuntimeConfigError
from .preload import preload, preloading
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
           "RuntimeConfigError", "configure", "context", "preload", "preloading", "reset",
           "stats"]


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
        self._table: Any = None  # the C form's entries by exact layout (None: Python form)
        self._entries: list[Entry] = []
        self._retired: Counter = Counter()  # provenance totals of rows `_retire` dropped
        self._zero_idx = tuple(tuned.params.index(n) for n in tuned.reset_to_zero)
        self._stream_of = current_stream_getter()
        self._multi_gpu = visible_gpus() != 1
        self._key: Any = _no_key
        self._keys = KEY_LEVELS[0]  # what keys hold: `declaration_reads.KEY_LEVELS`
        #: ``kernel(*args, **kwargs)`` and ``kernel.launch(stream, ...)`` (the kernel calls
        #: them directly): the slow path until a call is keyed, then a form of `hot_path`.
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
        from now on (a form made before that switch lands here too); anything else is
        raised naming the kernel."""
        if type(exc) is LayoutChanged:
            return self._first_call(stream, args, keys="alignment")
        if stream is None and refuses_stream(exc):
            self._use_stream_objects()
            return self.launch_entry(entry, stream, args)
        reraise_named(exc, self.tuned)

    def table_miss(self, stream: Any, args: tuple) -> None:
        """The C form found no entry of this exact layout: the key finds the entry (another
        exact layout of one key: added to the table), else the slow path."""
        memo = self._fast
        try:
            entry = memo[self._key(*args)]
        except Exception:  # a new layout (KeyError) or other argument kinds
            return self._first_call(stream, args)
        with self._lock:
            if self._fast is memo:  # not dropped meanwhile (`_retire`)
                self._add_layout(entry, args)
        self.launch_entry(entry, stream, args)

    def _add_layout(self, entry: Entry, args: tuple) -> None:
        """Serve calls of exactly ``args``'s layout with ``entry`` from the C form's table
        (under the lock). A full table starts over with the memo, without ``entry`` (its rows
        are folded into totals; the next call of its layout resolves it again)."""
        if self._table is None:
            return
        if len(self._table) >= self.ctx.settings.max_layouts:
            return self._retire()
        try:
            slot = self._table.add(args, entry, entry.grid, entry.kernel, entry.hot_tail,
                                   entry.device)
        except (TypeError, ValueError, OverflowError, RuntimeError, BufferError):
            return  # a layout the table cannot hold: the key serves it
        if slot.entry is entry and not any(s is slot for s in entry.slots):
            entry.slots.append(slot)

    def _raw_stream_refused(self, exc: Exception, stream: Any) -> bool:
        """Whether a launch on the current stream failed because cuTile takes no raw stream
        handle; if so, the runtime passes torch stream objects from now on."""
        return stream is None and refuses_stream(exc) and self._use_stream_objects()

    def _use_stream_objects(self) -> bool:
        """Launch on torch stream objects from now on (the hot path's form, which holds the
        getter, is made again). False when it already did (nothing changes)."""
        if self._stream_of is current_stream_object:
            return False
        self._stream_of = current_stream_object
        if self._key is not _no_key:  # a form serves the calls (else the slow path does)
            self._route(self._forms())
        return True

    def _launch(self, entry: Entry, stream: Any, args: tuple) -> None:
        """The general launch (the hot path's forms do its common case): nothing for a grid of
        no block (an empty batch); else zero the ``reset_to_zero`` arguments, pick the stream,
        build the kernel arguments, launch; an
        error names the kernel. `LayoutChanged` (the call's signature is not its entry's;
        nothing launched) is the caller's to handle."""
        entry.calls += 1
        if entry.empty:  # no block to run: nothing to launch, nothing to zero
            return
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
                self._resolve_and_launch(stream, args)
            except LayoutChanged:  # a pinned kernel shared by a signature derived differently
                self._key_at_least("alignment")
                self._resolve_and_launch(stream, args)

    def prepare(self, args: tuple) -> Entry | None:
        """Make the entry a call of ``args`` would, launching nothing: resolve it, have cuTile
        load its module (`cutile.load_module`), publish it in the memo and table. A later call
        of that layout then takes the hot path and launches at once. `preload` calls it with
        stand-ins of each tuning record's workload (`standins`). None when such a call has an
        entry already or cannot be keyed."""
        with self._lock:
            key = self._memo_key(args)
            if key is None or key in self._fast:
                return None
            return self._resolve_and_launch(None, args, load_only=True)

    def _resolve_and_launch(self, stream: Any, args: tuple, load_only: bool = False) -> Entry:
        """Resolve, launch (``load_only``: load the module, launch nothing) and publish the
        entry of a call's layout; returns it."""
        key = self._memo_key(args)
        entry = self._fast.get(key) if key is not None else None
        if entry is not None:  # another thread resolved this layout while we waited
            self._add_layout(entry, args)
            self._launch(entry, stream, args)
            return entry
        try:
            with LEDGER.first("first_resolve"):
                res = self.resolver.resolve(args, stream=stream)
        except Exception as exc:
            reraise_named(exc, self.tuned)
        need = res.keys_needed if res.signature is not None else \
            max(res.keys_needed, "alignment", key=KEY_LEVELS.index)
        if self._key_at_least(need):
            key = self._memo_key(args)
        if res.signature is not None and KEY_LEVELS.index(self._keys) < \
                KEY_LEVELS.index("alignment"):  # keys without alignment: pin the signature
            served = self.resolver.pinned_kernel(res.config, res.signature)
        else:
            served = res.served
        entry = Entry(res.grid, served, args, res.kernel_args,
                      partial(_kernel_args, self.tuned, res.config), res.device,
                      self._zero_idx)
        with self.ctx.policy.first_launch(self.name, res.workload_json, res.arch,
                                          res.cubin_from, res.cubin_class) as launched:
            if load_only:
                if not entry.empty:
                    load_module(self._stream_of(entry.device), entry.kernel, entry.build(args))
            else:
                with LEDGER.first("first_launch"):
                    self._launch(entry, stream, args)
        entry.info = provenance.describe(res, launched.cubin_from, launched.cubin_class)
        if key is not None:
            if len(self._fast) >= self.ctx.settings.max_layouts:
                self._retire()
            entry.key = key
            self._fast[key] = entry
            self._add_layout(entry, args)
        self._entries.append(entry)
        return entry

    def _retire(self) -> None:
        """Drop the hot-path memo and fold its provenance rows into totals, past
        ``CTBUILD_MAX_LAYOUTS`` layouts: a scalar argument that varies without bound must not
        grow memory."""
        self._retired += provenance.totals(self._entries)
        self._retired["rows", "dropped"] += len(self._entries)
        self._entries = []
        self._fast = {}
        if self._table is not None:
            self._table.clear()
        elif self._key is not _no_key:  # the Python form: it must not serve its last entry
            self._route(self._forms())

    def _forms(self) -> tuple[Callable[..., None], Callable[..., None]]:
        """The hot path's form for the current keys: C over the table where there is one."""
        forms = c_forms(self, self._table, self._stream_of) if self._table is not None \
            else None
        return forms if forms is not None else python_forms(self)

    def _route(self, forms: tuple[Callable[..., None], Callable[..., None]] | None) -> None:
        """Serve the kernel's calls with ``forms`` (None: the slow path until a call is
        keyed)."""
        self.call, self.launch = forms if forms is not None else \
            (self._call_first, self._launch_first)
        self.tuned.route(self, self.call, self.launch)

    def _key_at_least(self, keys: str) -> bool:
        """From now on keys hold at least what ``keys`` names; when that is more than they
        held, the memo starts over and this returns True."""
        if KEY_LEVELS.index(keys) <= KEY_LEVELS.index(self._keys):
            return False
        self._keys, self._key, self._table = keys, _no_key, None
        self._fast = {}
        self._route(None)
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
        # An exact layout decides more than keys of these levels; where pointers matter
        # (alignment, address) the Python form serves.
        plan = guard_plan(args) if self._keys in KEY_LEVELS[:2] else None
        self._table = new_table(args, plan) if plan is not None else None
        self._fast = {}
        self._route(self._forms())
        return key

    # ---- resolution and reports (not on the hot path) ----
    def resolve(self, args: tuple, kwargs: dict | None = None, **how: Any) -> Resolved:
        """`Resolver.resolve`: what a call launches, without launching it."""
        return self.resolver.resolve(args, kwargs, **how)

    def explain(self, args: tuple, kwargs: dict | None = None, *, arch: str | None = None,
                gpu: str | None = None) -> dict[str, Any]:
        """`TunedKernel.explain`: what `resolve` decides for a call, as a dict, launching
        nothing, counting and recording nothing. Without ``arch`` the call's CUDA tensors
        tell the GPU; with neither, it says to pass ``arch=`` (a CPU machine, `Tensor` specs)."""
        if arch is None and not any(_on_gpu(v) for v in (*args, *(kwargs or {}).values())):
            raise KernelCallError(
                f"kernel {self.name!r}: no CUDA tensor tells which GPU to explain for; pass "
                f"arch= (and gpu=, the GPU name the records were tuned on), e.g. "
                f"{self.name}.explain(..., arch='sm_90')")
        res = self.resolver.resolve(args, kwargs, arch=arch, gpu=gpu, dry=True)
        out = explanation(res, self.name, self.ctx.mode)
        out["cache"] = self.ctx.cache
        if arch is not None and self.tuned._wants_device:
            out["grid_device"] = explain_device(res.arch, gpu, self.tuned.folder)[1]
        if res.cubin_class == "miss" or res.config_from == "default":
            from ..miss_reasons import dim_names, explain_gaps
            assert res.spec is not None
            from ..range_rule import explain_candidates
            constants = self.tuned.constant_args(res.workload)
            out.update(explain_gaps(explain_candidates(self.tuned.declared_workloads, res.spec,
                                                       constants), res.spec, constants,
                                    cubin_miss=res.cubin_class == "miss", arch=res.arch,
                                    cache_problem=self.ctx.cache_problem,
                                    names=dim_names(self.tuned.module)))
        return out

    def served_kernel(self, cfg: Config) -> ServedKernel:
        return self.resolver.served_kernel(cfg)

    def provenance(self) -> dict[str, Any]:
        """Where this kernel's launches came from: counts by origin and per resolved call."""
        return provenance.summary(self.name, self.ctx.mode, list(self._entries),
                                  self.ctx.misses.total(self.name),
                                  len(self.resolver.kernel_objects()), self._keys, self._retired)


def _on_gpu(value: Any) -> bool:
    """Whether a call argument is a CUDA tensor (its device can tell the arch)."""
    device = device_of(value)
    return device is not None and device >= 0


def _kernel_args(tuned: TunedKernel, cfg: Config, args: tuple) -> tuple:
    """The kernel arguments of a call whose layout has no recipe (the args function runs)."""
    return tuned.kernel_args(cfg, tuned.bind(*args))
