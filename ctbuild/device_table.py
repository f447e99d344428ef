"""The device a ``grid(cfg, w, dev)`` function sees: the real GPU at tune and run time, a
nominal one per arch at plan time (a persistent kernel's grid needs the SM count).

The nominal table names one common SKU per arch; a project overrides it in ``ctbuild.toml``::

    [devices]
    sm_90 = { name = "NVIDIA H200", sm_count = 132 }

The plan only checks that the grid can be computed (it is not part of any compile key), so a
nominal SM count that differs from the serving GPU's changes nothing that is built.
"""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple

from .arch import Arch
from .declaration_checks import did_you_mean


class DeviceInfo(NamedTuple):
    """What grid functions may read: ``sm_count``, ``arch`` (``"sm_90"``) and ``name``. A
    NamedTuple: made at import (docs/architecture.md)."""
    name: str
    arch: str
    sm_count: int
    nominal: bool = False


#: One common SKU per arch tileiras targets (SM counts from the vendors' data sheets).
NOMINAL: dict[str, tuple[str, int]] = {
    "sm_80": ("NVIDIA A100-SXM4-80GB", 108),
    "sm_86": ("NVIDIA A10", 72),
    "sm_87": ("NVIDIA Jetson AGX Orin", 16),
    "sm_89": ("NVIDIA L40S", 142),
    "sm_90": ("NVIDIA H100 80GB HBM3", 132),
    "sm_100": ("NVIDIA B200", 148),
    "sm_103": ("NVIDIA B300", 148),
    "sm_110": ("NVIDIA Jetson AGX Thor", 20),
    "sm_120": ("NVIDIA GeForce RTX 5090", 170),
    "sm_121": ("NVIDIA GB10", 48),
}


def nominal_device(arch: str, overrides: Mapping[str, Mapping[str, Any]] | None = None
                   ) -> DeviceInfo:
    """The plan-time device of an arch: the project's ``[devices]`` entry, else the table's."""
    entry = dict((overrides or {}).get(str(arch), {}))
    name, sms = NOMINAL.get(str(arch), (f"nominal {arch}", 1))
    return DeviceInfo(str(entry.get("name", name)), str(arch), int(entry.get("sm_count", sms)),
                      nominal=True)


def explain_device(arch: str, gpu: str | None, near: Path | None) -> tuple[DeviceInfo, str]:
    """The device a ``grid(cfg, w, dev)`` sees when `explain` is asked about an arch with no
    GPU at hand, and where its SM count comes from: the project's ``[devices]`` entry (the
    config found from ``near``, the kernel's folder, as the runtime finds its cache), as the
    plan sees it; named ``gpu`` where given, with the SM count of the entry or nominal SKU of
    that name. A grid sized by the SMs is then the one that GPU would launch."""
    from .settings import config_table, project_config
    file, _ = project_config(near=near)
    devices = parse_devices(config_table(file).get("devices", {}), str(file)) \
        if file is not None and file.is_file() else {}
    dev = nominal_device(arch, devices)
    origin = f"[devices] {arch} in {file}" if arch in devices else f"the nominal {arch} GPU"
    if gpu is None or gpu == dev.name:
        return dev, f"{dev.name}, {dev.sm_count} SMs ({origin})"
    known = {name: sms for name, sms in NOMINAL.values()}
    if gpu in known:
        return (DeviceInfo(gpu, arch, known[gpu], nominal=True),
                f"{gpu}, {known[gpu]} SMs (ctbuild's table)")
    return (dev._replace(name=gpu), f"{gpu}, {dev.sm_count} SMs: its SM count is unknown, "
            f"so that of {origin}; give it in ctbuild.toml: [devices] {arch} = "
            f"{{ name = \"{gpu}\", sm_count = N }}")


#: The fields a ``[devices]`` entry may set.
DEVICE_FIELDS = ("name", "sm_count")


def parse_devices(table: Mapping[str, Any], where: str) -> dict[str, dict[str, Any]]:
    """Validate a ``[devices]`` table: ``sm_XY = { name = "...", sm_count = N }``."""
    from .arch import Arch
    out: dict[str, dict[str, Any]] = {}
    for arch, entry in table.items():
        try:
            key = str(Arch(arch))
        except ValueError as exc:
            raise ValueError(f"{where}: [devices] {exc}") from None
        if not isinstance(entry, Mapping):
            raise ValueError(f"{where}: [devices] {arch} must be a table with name and/or "
                             f"sm_count, got {entry!r}")
        if unknown := [k for k in entry if k not in DEVICE_FIELDS]:
            raise ValueError(f"{where}: [devices] {arch} has unknown field {unknown[0]!r}"
                             f"{did_you_mean(unknown[0], DEVICE_FIELDS)}; fields: "
                             f"{', '.join(DEVICE_FIELDS)}")
        sms = entry.get("sm_count", 1)
        if not isinstance(sms, int) or isinstance(sms, bool) or sms < 1:
            raise ValueError(f"{where}: [devices] {arch}.sm_count must be a positive integer")
        out[key] = dict(entry)
    return out


def cuda_device(index: int) -> DeviceInfo:
    """The real GPU ``index`` (torch)."""
    import torch
    props = torch.cuda.get_device_properties(index)
    return DeviceInfo(props.name, str(Arch.from_capability(props.major, props.minor)),
                      props.multi_processor_count)


def wants_device(fn: Callable[..., Any]) -> bool:
    """Whether a grid function takes the device as its third parameter."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return True
    return len([p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]) >= 3
