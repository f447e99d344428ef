"""What the hot path keeps per call layout: a resolved `Entry` and how it rebuilds the kernel
arguments from the next call's arguments without running the declared ``args`` function."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .served_kernel import ServedKernel


class Entry:
    """A resolved call layout: grid, served kernel, the recipe of the kernel arguments, the
    device, the ``reset_to_zero`` positions, a launch count, what resolved it (``info``,
    filled after its first launch, for provenance) and, where the C form serves it, its exact
    layouts in the kernel's table (``slots``: `_fast_path.HotEntry`, each counting the
    launches it made)."""
    __slots__ = ("grid", "kernel", "tail", "hot_tail", "recipe", "rebuild", "device", "zero",
                 "empty", "calls", "info", "slots", "key")

    def __init__(self, grid: tuple[int, ...], kernel: ServedKernel, call_args: tuple,
                 kernel_args: tuple, rebuild: Callable[[tuple], tuple], device: int,
                 zero: tuple[int, ...]) -> None:
        self.grid, self.kernel, self.device, self.zero = grid, kernel, device, zero
        self.tail, self.recipe = recipe_of(call_args, kernel_args)
        #: A grid of no block (an empty batch): the launch is a no-op, which CUDA refuses to be
        #: asked for ("invalid argument"), so `KernelRuntime._launch` skips it.
        self.empty = 0 in grid
        #: The tail when the hot path can launch ``args + tail`` itself (nothing to zero, a
        #: grid with blocks).
        self.hot_tail = None if zero or self.empty else self.tail
        self.rebuild = rebuild
        self.calls = 0
        self.info: dict[str, Any] = {}
        self.slots: list[Any] = []
        #: Its hot-path key, once the memo holds it (the Python form compares a call's key
        #: with the last entry's).
        self.key: tuple | None = None

    def launches(self) -> int:
        """Launches of this entry: counted in Python, and by each of its table slots (a slot
        the table dropped keeps counting calls in flight, so none is folded away)."""
        return self.calls + sum(s.calls for s in self.slots)

    def build(self, args: tuple) -> tuple:
        """The kernel arguments of a call with these call arguments."""
        if self.tail is not None:
            return args + self.tail
        if self.recipe is not None:
            return tuple([args[v] if is_arg else v for is_arg, v in self.recipe])
        return self.rebuild(args)


def recipe_of(call_args: tuple, kernel_args: tuple
              ) -> tuple[tuple | None, tuple[tuple[bool, Any], ...] | None]:
    """How to rebuild the kernel arguments from the call arguments on the hot path.

    Each kernel argument is either one of the call arguments (by identity) or a plain constant
    (derived from shapes/values that the key covers). Returns (tail, None) when the kernel
    arguments are the call arguments followed by constants, else (None, recipe); (None, None)
    when some argument is neither (e.g. a new tensor view): then the args function runs per call.
    """
    recipe = []
    position: dict[int, int] = {}  # the first position of each call argument, by identity
    for i, a in enumerate(call_args):
        position.setdefault(id(a), i)
    for value in kernel_args:
        idx = position.get(id(value))  # both tuples are alive: equal ids are one object
        if idx is not None:
            recipe.append((True, idx))
        elif _plain(value):
            recipe.append((False, value))
        else:
            return None, None
    n = len(call_args)
    if len(recipe) >= n and all(r == (True, i) for i, r in enumerate(recipe[:n])) and \
            not any(is_arg for is_arg, _ in recipe[n:]):
        return tuple(v for _, v in recipe[n:]), None
    return None, tuple(recipe)


def _plain(value: Any) -> bool:
    if isinstance(value, tuple):
        return all(_plain(v) for v in value)
    return value is None or type(value) in (bool, int, float, str)

