"""Search spaces: Cartesian products with constraints, explicit config lists, zipped axes.

A space enumerates candidate configs deterministically; `prune` applies the constraint for one
(workload, arch) and the per-kernel cap. Pruning is deterministic so that the build and the tuner
agree on the candidate set without talking to each other.
"""
from __future__ import annotations

import itertools
import json
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

#: Axis names that are cuTile compiler hints rather than kernel arguments: the fields of
#: ``cuda.tile``'s ``CompilerOptions`` (``ct.kernel(occupancy=...)``).
HINT_NAMES = ("occupancy", "num_ctas", "num_worker_warps", "opt_level")
#: Triton's tuning knobs, which cuTile does not have (it picks threads and pipelining itself).
TRITON_KNOBS = ("num_warps", "num_stages", "maxnreg")

Constraint = Callable[..., bool]


class Config(Mapping[str, Any]):
    """One point of a search space: a read-only mapping with attribute access (``cfg.TM``)."""

    __slots__ = ("_values", "_hash", "_owner")

    def __init__(self, values: Mapping[str, Any], owner: str = "") -> None:
        object.__setattr__(self, "_values", dict(values))
        try:
            digest = hash(tuple(sorted(self._values.items())))
        except TypeError:  # a list or an object as a value: read from a shared cache, no
            digest = hash(json.dumps(self._values, sort_keys=True, default=repr))  # axis has it
        object.__setattr__(self, "_hash", digest)
        object.__setattr__(self, "_owner", owner)

    def __reduce__(self) -> tuple[Any, ...]:
        """Copied and pickled by its values (`copy.deepcopy` of a config, or of a space or
        record holding one, would otherwise set its read-only slots)."""
        return (Config, (self._values, self._owner))

    def __getattr__(self, name: str) -> Any:
        if name in Config.__slots__:  # not set yet: an object being built, not an axis
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            raise UnknownAxisError(name, self._owner, tuple(self._values)) from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Config is read-only")

    def __getitem__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise UnknownAxisError(name, self._owner, tuple(self._values)) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Config):  # the common case, in every dict a tune keys by config
            return self._hash == other._hash and self._values == other._values
        return isinstance(other, Mapping) and self._values == dict(other)

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{k}={v!r}" for k, v in self._values.items()) + "}"

    def to_json(self) -> dict[str, Any]:
        return dict(self._values)


class UnknownAxisError(KeyError, AttributeError):
    """A grid/args/hints function asked a config for an axis the space does not have."""

    def __init__(self, name: str, owner: str, axes: Sequence[str]) -> None:
        self.name, self.owner, self.axes = name, owner, tuple(axes)
        super().__init__(name)

    def __str__(self) -> str:
        who = f"kernel {self.owner!r}: " if self.owner else ""
        return (f"{who}config has no axis {self.name!r} (axes: {', '.join(self.axes) or 'none'}); "
                "add it to the search space or fix the grid/args/hints function")


class Space:
    """Base of all spaces: enumerate() yields plain dicts in a fixed order."""

    where: Constraint | None = None

    def enumerate(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def axes(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for cfg in self.enumerate():
            seen.update(dict.fromkeys(cfg))
        return tuple(seen)

    def __len__(self) -> int:
        return len(self.enumerate())


class Zip(Space):
    """Several axes that vary together: ``Zip(TM=[64, 128], TN=[128, 256])`` gives 2 configs."""

    def __init__(self, **axes: Sequence[Any]) -> None:
        if not axes:
            raise ValueError("Zip needs at least one axis")
        lengths = {name: len(values) for name, values in axes.items()}
        if empty := [name for name, n in lengths.items() if n == 0]:
            raise ValueError(f"Zip axis {empty[0]!r} has no values; give it at least one")
        if len(set(lengths.values())) != 1:
            raise ValueError(f"Zip axes must have equal lengths, got {lengths}")
        self._axes = {k: list(v) for k, v in axes.items()}

    def enumerate(self) -> list[dict[str, Any]]:
        names = list(self._axes)
        return [dict(zip(names, values)) for values in zip(*self._axes.values())]


class Product(Space):
    """Cartesian product of axes (lists) and zipped groups, filtered by ``where``.

    ``where(cfg, w, arch)`` may look at the config, the workload (``w.A.shape``) and the target
    arch (``arch.cc >= 100``); a constraint that takes fewer parameters gets the first ones.
    """

    def __init__(self, *groups: Zip, where: Constraint | None = None,
                 **axes: Sequence[Any]) -> None:
        for group in groups:
            if not isinstance(group, Zip):
                fix = f"; write Product(**{group!r})" if isinstance(group, Mapping) else ""
                raise TypeError(f"Product takes axes as keywords (Product(TM=[64, 128])) and Zip "
                                f"groups, got the {type(group).__name__} {group!r}{fix}")
        for name, values in axes.items():
            if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
                raise TypeError(f"axis {name!r} must be a list of values, got {values!r}")
            if not list(values):
                raise ValueError(f"axis {name!r} has no values; give it at least one "
                                 f"(e.g. {name}=[64])")
        self._parts: list[list[dict[str, Any]]] = [g.enumerate() for g in groups]
        self._parts += [[{name: v} for v in values] for name, values in axes.items()]
        names = [n for part in self._parts for n in (part[0] if part else {})]
        if len(names) != len(set(names)):
            raise ValueError(f"an axis appears twice in the space: {names}")
        self.where = where

    def enumerate(self) -> list[dict[str, Any]]:
        out = []
        for combo in itertools.product(*self._parts):
            cfg: dict[str, Any] = {}
            for part in combo:
                cfg.update(part)
            out.append(cfg)
        return out


class Configs(Space):
    """An explicit list of configs (dicts), optionally filtered by ``where``."""

    def __init__(self, configs: Iterable[Mapping[str, Any]], *,
                 where: Constraint | None = None) -> None:
        if isinstance(configs, (Mapping, str)) or not isinstance(configs, Iterable):
            raise TypeError(f"Configs takes a list of dicts, one per config, got the "
                            f"{type(configs).__name__} {configs!r}")
        items = list(configs)
        if bad := [c for c in items if not isinstance(c, Mapping)]:
            raise TypeError(f"Configs takes a list of dicts, one per config, got the "
                            f"{type(bad[0]).__name__} {bad[0]!r} in it")
        self._configs = [dict(c) for c in items]
        if not self._configs:
            raise ValueError("Configs needs at least one config")
        self.where = where

    def enumerate(self) -> list[dict[str, Any]]:
        return [dict(c) for c in self._configs]


def as_space(space: Space | Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Any]]) -> Space:
    """Accept the shorthand forms: a list of dicts, or a dict of axes."""
    if isinstance(space, Space):
        return space
    if isinstance(space, Mapping):
        if "where" in space:  # Product's keyword for the constraint, never an axis
            raise ValueError("an axis cannot be named 'where'; to constrain a space use "
                             "Product(..., where=...)")
        axes: dict[str, Any] = dict(space)
        return Product(**axes)
    if isinstance(space, str) or not isinstance(space, Iterable):
        raise TypeError(f"the space must be a Product, Configs, a dict of axes or a list of "
                        f"configs, got the {type(space).__name__} {space!r}")
    return Configs(space)


def call_constraint(where: Constraint, cfg: Config, workload: Any, arch: Any) -> bool:
    """Call a constraint with as many of (cfg, workload, arch) as it declares."""
    code = getattr(where, "__code__", None)
    nargs = code.co_argcount if code is not None else 3
    if code is not None and code.co_flags & 0x04:  # *args
        nargs = 3
    return bool(where(*(cfg, workload, arch)[:max(1, min(nargs, 3))]))


def cap_configs(configs: list[Config], default: Config, cap: int) -> list[Config]:
    """Keep at most ``cap`` configs, evenly spread over the enumeration order, default included.

    Even spacing keeps coverage of the whole space (first-N would keep only the smallest tiles).
    """
    if len(configs) <= cap:
        return configs
    others = [c for c in configs if c != default]
    room = cap - 1
    if room <= 0:
        return [default]
    step = len(others) / room
    picked = [others[int(i * step)] for i in range(room)]
    keep = set(picked) | {default}
    return [c for c in configs if c in keep]
