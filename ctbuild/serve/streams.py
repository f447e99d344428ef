"""Which CUDA stream a launch goes to, and zeroing arguments on it.

``kernel(...)`` launches on the current torch stream of the arguments' device; the fastest way
to it is torch's raw handle getter (an int, which ``ct.launch`` takes). A cuTile that refuses a
raw handle makes the runtime switch to torch stream objects, once (`refuses_stream`).
``kernel.launch(stream, ...)`` takes a torch stream, an external stream object or a raw handle.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .errors import KernelCallError

#: A device index -> its current stream (a raw handle or a torch stream object).
StreamGetter = Callable[[int], Any]


def current_stream_getter() -> StreamGetter:
    """torch's raw current-stream getter where it has one, else torch stream objects."""
    raw = raw_stream_getter()
    return raw if raw is not None else current_stream_object


def raw_stream_getter() -> StreamGetter | None:
    """torch's getter of a device's current stream as a raw handle (None where it has none)."""
    import torch
    return getattr(torch._C, "_cuda_getCurrentRawStream", None)


def current_stream_object(device: int) -> Any:
    import torch
    return torch.cuda.current_stream(device)


def refuses_stream(exc: Exception) -> bool:
    """Whether a launch failed because cuTile refused the stream it was given."""
    return isinstance(exc, TypeError) and "stream" in str(exc).lower()


def torch_stream(stream: Any, device: int) -> Any:
    """A torch stream object for ``stream`` (None: the device's current stream)."""
    import torch
    if stream is None:
        return torch.cuda.current_stream(device)
    if isinstance(stream, torch.cuda.Stream):
        return stream
    handle = stream if isinstance(stream, int) else getattr(stream, "cuda_stream", None)
    if handle is None:
        raise KernelCallError(f"cannot use {stream!r} as a CUDA stream")
    return torch.cuda.ExternalStream(int(handle), device=device)


def zero_args(stream: Any, args: tuple, idx: tuple[int, ...]) -> None:
    """Zero the ``reset_to_zero`` arguments on the stream the kernel will run on."""
    if stream is None:
        for i in idx:
            args[i].zero_()
        return
    import torch
    device = next((args[i].get_device() for i in idx), 0)
    with torch.cuda.stream(torch_stream(stream, device)):
        for i in idx:
            args[i].zero_()


def visible_gpus() -> int:
    """CUDA devices torch sees (with one, the device index is left out of hot-path keys)."""
    try:
        import torch
        return torch.cuda.device_count()
    except Exception:
        return 0
