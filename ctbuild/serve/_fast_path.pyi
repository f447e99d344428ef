# The C module's types (ctbuild/serve/_fast_path.c); optional, see layout_guard.
from collections.abc import Callable
from typing import Any

class LayoutCheck:
    def __init__(self, args: tuple, tensors: tuple[int, ...], scalars: tuple[int, ...]) -> None: ...
    def __call__(self, *args: Any) -> bool: ...

class ArmedCall:
    calls: int
    def __init__(self, entry: Any, check: LayoutCheck, grid: tuple, kernel: Any, tail: tuple,
                 device: int, stream_of: Callable[[int], Any] | None, launch: Callable[..., Any],
                 refused: Callable[..., Any], keywords: Callable[..., Any],
                 failed: Callable[..., Any], with_stream: bool) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> None: ...
