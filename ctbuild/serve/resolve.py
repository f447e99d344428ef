"""Resolution: what one call of a declared kernel launches (the slow path, once per layout).

Bind the arguments; compute the tuning key (and, for a dynamic workload, its bucket's: the
sub-bucket's where ``ctbuild tune --refine`` split the bucket, `ctbuild.bucket_map`); find the
winner -- remembered, else the cache's tuning record for this GPU, else the miss policy; find the
most specialised cached CUBIN covering the call with that config (else the default config's,
when one covers it; else a CUBIN miss for the miss policy); then the grid and the kernel
arguments. With ``arch`` (and ``gpu``) given no CUDA device is consulted (the grid sees the
arch's nominal device): CPU tests and `TunedKernel.explain` resolve host tensors or specs.
"""
from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..arch import Arch
from ..bucket_map import (
    BucketMapError,
    Split,
    class_winners,
    layout_class,
    read_splits,
    split_for,
    why,
)
from ..device_table import DeviceInfo, cuda_device, explain_device
from ..dims import Bucket, find_bucket, match
from ..keys import record_key_for
from ..range_rule import beyond_range
from ..records import stored_tuning
from ..signature import derive_signature, signature_class, signature_text
from ..space import Config
from ..specs import Workload
from ..waves import WaveTable
from .declaration_reads import DeclarationReads
from .errors import KernelCallError
from .ledger import LEDGER
from .live_args import device_of, workload_spec
from .misses import workload_json
from .online_tune import tune_online
from .served_kernel import ServedKernel

if TYPE_CHECKING:
    from ..declare import TunedKernel
    from .context import RuntimeContext

log = logging.getLogger("ctbuild.runtime")

#: How many tuning keys without a record, and how many signatures, a kernel remembers (then it
#: starts over).
MAX_REMEMBERED = 4096


@dataclass
class Resolved:
    """What one call resolves to (also computed without a GPU)."""
    config: Config
    config_from: str            # cache | memory | default | disabled | online | fallback
    cubin_from: str             # cache | jit (expected; corrected if the launch JIT-compiles)
    cubin_class: str            # exact | relaxed | generic | miss (expected, like cubin_from)
    bucket: dict[str, int] | None
    arch: str
    gpu: str
    device: int
    tuning_key: list
    record_key: str | None
    compile_key: str | None
    grid: tuple[int, ...]
    kernel_args: tuple
    served_of: Callable[[Config], ServedKernel]  # the resolver's `served_kernel`
    workload: Workload
    workload_json: dict[str, Any]
    keys_needed: str            # the key level the declared functions' reads need
    signature: str | None       # `signature_text` of the exact launch signature, if derivable
    spec: Workload | None = None  # the call as specs (`live_args.workload_spec`)
    sub_bucket: dict[str, int] | None = None  # the refined sub-bucket the call maps to
    bucket_why: str | None = None  # where the bucket was refined: which sub-bucket, and why
    layout_class: str | None = None  # the layout class whose own winner serves (``by_class``)

    @property
    def served(self) -> ServedKernel:
        """The config's served kernel (made on first use: a call whose launch signature is
        pinned launches a pinned one instead, `Resolver.pinned_kernel`)."""
        return self.served_of(self.config)


class Resolver:
    """Resolves the calls of one declared kernel; owns its served kernels (one per config) and
    the winners it found (per tuning key, arch and GPU)."""

    def __init__(self, tuned: TunedKernel, ctx: RuntimeContext) -> None:
        self.tuned, self.ctx = tuned, ctx
        self.lock = threading.RLock()
        self.served: dict[Config, ServedKernel] = {}
        self._pinned: dict[tuple[Config, str], ServedKernel] = {}
        #: per (tuning key, arch, GPU): (winner, where it came from, record key, its winners by
        #: layout class)
        self._winners: dict[tuple[str, str, str], tuple[Config, str, str | None,
                                                      dict[str, Config | WaveTable]]] = {}
        #: the (tuning key, arch, GPU)s the cache has no record of (a `Dim` call's own sizes,
        #: mostly: it then takes its bucket's); bounded like the hot-path memo
        self._unrecorded: set[tuple[str, str, str]] = set()
        self._bucket_keys: dict[Bucket, tuple[list, str]] = {}  # `_bucket_key`'s
        self._signatures: dict[tuple, tuple[Any, str]] = {}  # `_signature`'s, by class
        self._maps: dict[tuple[Bucket, str, str], tuple[Split, ...]] = {}  # `_splits`'
        self._space: list[Config] | None = None
        self._devices: dict[int, DeviceInfo] = {}

    def resolve(self, args: tuple, kwargs: dict | None = None, *, stream: Any = None,
                arch: str | None = None, gpu: str | None = None, device: int = 0,
                dry: bool = False) -> Resolved:
        """Resolve a call without launching it (see the module doc). ``dry``: count nothing,
        record nothing, raise no miss, tune nothing (`explain`)."""
        tuned = self.tuned
        with self.lock:
            w = tuned.bind(*args, **(kwargs or {}))
            device, arch, gpu, dev = self._target(w, arch, gpu, device)
            spec_w = workload_spec(tuned, w)
            wl_json = workload_json(spec_w)
            bucket = find_bucket(tuned.dynamic_workloads, spec_w) \
                if tuned.dynamic_workloads else None
            beyond = beyond_range(tuned.declared_workloads, spec_w, tuned.constant_args(w)) \
                if bucket is None and tuned.dynamic_workloads else None
            if beyond is not None and not dry:  # strict mode raises here
                self.ctx.policy.range_miss(tuned, beyond, arch, wl_json)
            reads = DeclarationReads()
            with reads:
                own = tuned.tuning_key(w)
                default = tuned.default_config(w)
            keys = [(own, _text(own))]
            sub, bucket_why = self._refined(bucket, spec_w, arch, gpu) if bucket is not None \
                else (None, None)
            for b in (sub, bucket):  # the (sub-)bucket's record, unless this size was tuned
                if b is not None and (rep := self._bucket_key(b)) not in keys:
                    keys.append(rep)
            cfg, config_from, record_key, tk, by_class = self._winner(w, keys, arch, gpu,
                                                                      wl_json, stream, dry)
            def blocks(c: Config) -> int:
                with reads:  # a finalist's grid reads the call as the served one's does
                    return math.prod(tuned.grid(c, w, dev))
            cfg, config_from, cover, by_layout = self._served(cfg, config_from, default,
                                                              by_class, bucket, spec_w, arch,
                                                              blocks)
            compile_key, cubin_class, signature = cover
            cubin_from = "cache"
            if cubin_class is None:
                cubin_class, cubin_from = "miss", "jit"
                if not dry and compile_key is not None:
                    self.ctx.policy.cubin_miss(tuned, cfg, compile_key, arch, wl_json)
            elif beyond is not None:  # a CUBIN covers it, but no build planned or tuned it
                cubin_class = "miss"
            with reads:
                grid = tuned.grid(cfg, w, dev)
                kernel_args = tuned.kernel_args(cfg, w)
            if reads.why is not None:
                log.debug("ctbuild: %s: the declaration reads %s of a tensor: hot-path keys "
                          "hold the %s", tuned.name, reads.why, reads.needs)
            return Resolved(cfg, config_from, cubin_from, cubin_class,
                            bucket.to_json() if bucket is not None else None, arch, gpu, device,
                            tk, record_key, compile_key, grid, kernel_args, self.served_kernel, w, wl_json,
                            reads.needs, signature, spec_w,
                            sub.to_json() if sub is not None else None, bucket_why, by_layout)

    def _served(self, cfg: Config, config_from: str, default: Config,
                by_class: dict[str, Config | WaveTable], bucket: Bucket | None,
                spec_w: Workload, arch: str, blocks: Callable[[Config], int]
                ) -> tuple[Config, str, tuple[str | None, str | None, str | None], str | None]:
        """(config, where it came from, its `_cover`, the layout class whose winner it is) a
        call is served with: the winner, or its layout class's
        (`ctbuild.bucket_map.layout_class`) where the record has one and its CUBIN is cached
        (where the class has a `ctbuild.waves.WaveTable`: the finalist it predicts fastest at
        this call, ``blocks(config)`` its grid's block count here); a recorded winner whose
        CUBIN is not, the default's if that is cached, rather than a JIT (a winner tuned
        online in this process is served as measured)."""
        cover = self._cover(cfg, spec_w, arch)
        sizes = match(bucket.declared, spec_w) if by_class and bucket is not None else None
        cls = layout_class(sizes) if sizes is not None else None
        alt = by_class.get(cls) if cls is not None else None
        if isinstance(alt, WaveTable):
            alt = _by_waves(alt, sizes or {}, blocks, self.tuned.name)
        if alt is not None and alt != cfg and self._in_space(alt):
            other = self._cover(alt, spec_w, arch)
            if other[1] is not None:
                return alt, config_from, other, cls
        if cover[1] is None and cfg != default and config_from != "online":
            fallback = self._cover(default, spec_w, arch)
            if fallback[1] is not None:
                return default, "fallback", fallback, None
        return cfg, config_from, cover, None

    def _refined(self, bucket: Bucket, spec_w: Workload, arch: str, gpu: str
                 ) -> tuple[Bucket | None, str | None]:
        """(the sub-bucket the call maps to, or None; what explain says of it, None where the
        bucket was not refined)."""
        splits = self._splits(bucket, arch, gpu)
        sizes = match(bucket.declared, spec_w) if splits else None
        if sizes is None:
            return None, None
        chosen = split_for(splits, sizes)
        return (chosen.sub_bucket(bucket) if chosen else None), why(sizes, bucket, splits, chosen)

    def _splits(self, bucket: Bucket, arch: str, gpu: str) -> tuple[Split, ...]:
        """The split points recorded in the bucket's tuning record for this GPU, read once per
        bucket, arch and GPU; () when there are none or they are not usable (a warning)."""
        ctx = self.ctx
        if ctx.settings.disable_autotune or ctx.toolchain_fp is None or ctx.store is None:
            return ()
        memo_key = (bucket, arch, gpu)
        found = self._maps.get(memo_key)
        if found is None:
            tk = self._bucket_key(bucket)[0]
            record_key = record_key_for(self.tuned, tk, arch, gpu, ctx.toolchain_fp)
            record = stored_tuning(ctx.store, record_key)
            try:
                found = read_splits(record.refined if record is not None else None, bucket)
            except BucketMapError as exc:
                log.warning("ctbuild: kernel %r: the refined buckets in tuning record %s are not "
                            "used (%s); the declared bucket serves", self.tuned.name, record_key,
                            exc)
                found = ()
            self._maps[memo_key] = found
        return found

    def _bucket_key(self, bucket: Bucket) -> tuple[list, str]:
        """(the tuning key of a bucket's representative, its text): computed once per bucket,
        as every new size in the bucket asks for it."""
        found = self._bucket_keys.get(bucket)
        if found is None:
            tk = self.tuned.tuning_key(bucket.representative)
            found = self._bucket_keys[bucket] = (tk, _text(tk))
        return found

    def served_kernel(self, cfg: Config) -> ServedKernel:
        """The one `ServedKernel` of a config (created on first use, thread-safe)."""
        served = self.served.get(cfg)
        if served is None:
            with self.lock:
                served = self.served.get(cfg)
                if served is None:
                    served = ServedKernel(self.tuned, cfg, self.ctx.source)
                    self.served[cfg] = served
        return served

    def pinned_kernel(self, cfg: Config, signature: str) -> ServedKernel:
        """The pinned `ServedKernel` of a config and launch signature (one per pair, so each
        signature's CUBIN is loaded once however many hot-path entries launch it)."""
        with self.lock:
            served = self._pinned.get((cfg, signature))
            if served is None:
                served = ServedKernel(self.tuned, cfg, self.ctx.source, pinned=True)
                self._pinned[(cfg, signature)] = served
            return served

    def kernel_objects(self) -> list[ServedKernel]:
        """The served kernels (cuTile kernel objects) this kernel holds."""
        with self.lock:
            return [*self.served.values(), *self._pinned.values()]

    def _winner(self, w: Workload, keys: list[tuple[list, str]], arch: str, gpu: str,
                wl_json: dict, stream: Any, dry: bool = False
                ) -> tuple[Config, str, str | None, list, dict[str, Config | WaveTable]]:
        """(config, where it came from, record key, tuning key, the record's winners by layout
        class): the first of ``keys`` (the call's own tuning key, then its sub-bucket's, then
        its bucket's; each with its `_text`) with a record, else the miss policy's."""
        tuned, ctx = self.tuned, self.ctx
        if ctx.settings.disable_autotune:
            return tuned.default_config(w), "disabled", None, keys[-1][0], {}
        for tk, text in keys:
            memo_key = (text, arch, gpu)
            known = self._winners.get(memo_key)
            if known is not None:
                cfg, origin, record_key, by_class = known
                return cfg, origin if origin != "cache" else "memory", record_key, tk, by_class
            if memo_key in self._unrecorded:
                continue
            record_key = self._record_key(tk, arch, gpu)
            record = stored_tuning(ctx.store, record_key) if (
                record_key is not None and ctx.store is not None) else None
            if record is not None:
                cfg = Config(record.config or {}, tuned.name)
                if self._in_space(cfg):
                    by_class = class_winners(record.by_class, tuned.name)
                    if not dry:
                        self._winners[memo_key] = (cfg, "cache", record_key, by_class)
                        LEDGER.saved("tuning", record.seconds)
                    return cfg, "cache", record_key, tk, by_class
                log.warning("ctbuild: kernel %r: tuning record %s names config %s, which is not "
                            "in the declared search space (stale record?); treated as a miss",
                            tuned.name, record_key, record.config)
            elif not dry and ctx.store is not None:
                if len(self._unrecorded) >= MAX_REMEMBERED:
                    self._unrecorded.clear()
                self._unrecorded.add(memo_key)
        tk, text = keys[-1]
        record_key = self._record_key(tk, arch, gpu)
        if dry:
            return tuned.default_config(w), "default", record_key, tk, {}
        cfg, origin = ctx.policy.tuning_miss(
            tuned, tuning_key=tk, arch=arch, gpu=gpu, record_key=record_key,
            workload_json=wl_json, default=tuned.default_config(w),
            tune=lambda: tune_online(tuned, ctx, w, device=self._device_for(w), arch=arch,
                                     gpu=gpu, record_key=record_key, stream=stream,
                                     served=self.served_kernel))
        self._winners[(text, arch, gpu)] = (cfg, origin, record_key, {})
        return cfg, origin, record_key, tk, {}

    def _record_key(self, tk: list, arch: str, gpu: str) -> str | None:
        """The cache key of the tuning record of ``tk`` (None without a toolchain)."""
        fp = self.ctx.toolchain_fp
        return record_key_for(self.tuned, tk, arch, gpu, fp) if fp is not None else None

    def _target(self, w: Workload, arch: str | None, gpu: str | None, device: int
                ) -> tuple[int, str, str, DeviceInfo | None]:
        """(device, arch, GPU name, device facts for the grid) of a call: its tensors' GPU, or
        the ``arch`` (and ``gpu``) `explain` was asked about, with the facts the project's
        ``[devices]`` (or the nominal table) gives that GPU."""
        if arch is None:
            device = self._device_for(w)
            arch, dev_gpu = self.ctx.device_info(device)
            gpu = gpu or dev_gpu
            dev = self._device_facts(device) if self.tuned._wants_device else None
        else:
            dev = explain_device(str(Arch(arch)), gpu, self.tuned.folder)[0] \
                if self.tuned._wants_device else None
        return device, str(Arch(arch)), gpu or "unknown GPU", dev

    def _cover(self, cfg: Config, spec_w: Workload, arch: str
               ) -> tuple[str | None, str | None, str | None]:
        """(compile key, class, signature text) of the most specialised cached CUBIN serving
        this call with this config, or (the exact compile key, None, text) when none does --
        the same lattice `ServedKernel._compile` walks inside the launch. (None, "exact", None)
        when the signature cannot be derived up front: the dispatcher will judge."""
        tuned, ctx = self.tuned, self.ctx
        try:
            signature, text = self._signature(tuned.kernel_args(cfg, spec_w))
        except Exception as exc:  # the dispatcher will judge; ServedKernel handles a miss
            log.debug("ctbuild: %s: cannot derive the signature up front: %s", tuned.name, exc)
            return None, "exact", None
        found = ctx.source.covering(tuned, cfg, signature, arch, text)
        if found is not None:
            return found[1], found[0], text
        return ctx.source.key_for(tuned, cfg, signature, arch, text), None, text

    def _signature(self, kernel_args: tuple) -> tuple[Any, str]:
        """(signature, its text) of a launch with these kernel arguments (specs), derived once
        per `signature_class`: a new size of a `Dim` bucket mostly shares its class (~0.2 ms
        of a new size's resolve on a server CPU, otherwise)."""
        cls = signature_class(self.tuned.kernel, kernel_args)
        found = self._signatures.get(cls) if cls is not None else None
        if found is None:
            signature = derive_signature(self.tuned.kernel, kernel_args, mangled=False)
            found = (signature, signature_text(signature))
            if cls is not None:
                if len(self._signatures) >= MAX_REMEMBERED:
                    self._signatures.clear()
                self._signatures[cls] = found
        return found

    def _in_space(self, cfg: Config) -> bool:
        if self._space is None:
            self._space = [Config(c) for c in self.tuned.space.enumerate()]
        return cfg in self._space

    def _device_facts(self, device: int) -> DeviceInfo:
        """What ``grid(cfg, w, dev)`` sees of a real GPU (queried once per device)."""
        facts = self._devices.get(device)
        if facts is None:
            facts = self._devices[device] = cuda_device(device)
        return facts

    def _device_for(self, w: Workload) -> int:
        """The CUDA device of the call's tensors; refuses host tensors and mixed devices."""
        devices: dict[int, str] = {}
        for name, value in w.items():
            d = device_of(value)
            if d is None:
                continue
            if d < 0:
                where = getattr(getattr(value, "device", None), "type", "host")
                raise KernelCallError(
                    f"kernel {self.tuned.name!r}: argument {name!r} is a {where} tensor; "
                    "ctbuild kernels launch on CUDA tensors (move it with .cuda())")
            devices.setdefault(d, name)
        if not devices:
            raise KernelCallError(f"kernel {self.tuned.name!r}: no CUDA tensor among the "
                                  f"arguments ({', '.join(w)}): cannot tell which GPU to "
                                  "launch on")
        if len(devices) > 1:
            shown = ", ".join(f"{n} on cuda:{d}" for d, n in devices.items())
            raise KernelCallError(f"kernel {self.tuned.name!r}: arguments are on different "
                                  f"GPUs ({shown}); put them on one device")
        return next(iter(devices))


def _text(tuning_key: Any) -> str:
    """A tuning key as the text the resolver's memos key it by."""
    return json.dumps(tuning_key, sort_keys=True)


def explanation(res: Resolved, kernel: str, mode: str) -> dict[str, Any]:
    """`TunedKernel.explain`'s dict: what resolving a call decided."""
    return {"kernel": kernel, "config": res.config.to_json(),
            "config_from": {"memory": "record", "cache": "record"}.get(
                res.config_from, res.config_from),
            "bucket": res.bucket, "cubin_class": res.cubin_class,
            "compile_key": res.compile_key, "cached": res.cubin_class != "miss",
            "tuning_key": res.tuning_key, "record_key": res.record_key, "arch": res.arch,
            "gpu": res.gpu, "grid": list(res.grid), "mode": mode,
            "workload": res.workload_json, "sub_bucket": res.sub_bucket,
            **({"bucket_why": res.bucket_why} if res.bucket_why else {}),
            **({"layout_class": res.layout_class} if res.layout_class else {})}


def _by_waves(table: WaveTable, sizes: Mapping[str, int], blocks: Callable[[Config], int],
              kernel: str) -> Config | None:
    """The config ``table`` chooses for a call of these Dim sizes; its fallback where a
    finalist's grid cannot be computed for the call (the declaration's grid function raised:
    it is the user's code)."""
    try:
        return table.choose(sizes, blocks)
    except Exception as exc:  # noqa: BLE001 - a user grid function; the class's config serves
        log.debug("ctbuild: %s: no choice by waves: %s", kernel, exc)
        return table.fallback
