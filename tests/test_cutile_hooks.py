"""`ctbuild.cutile`: the installed cuda-tile fits every private hook ctbuild uses, and a cuTile
that changed fails with one error naming each changed hook."""
from __future__ import annotations

import cuda.tile as ct
import cuda.tile._cext as cext
import pytest

from ctbuild import cutile


def test_installed_cutile_fits_every_hook() -> None:
    assert cutile.problems() == []


def test_every_changed_hook_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    def new_compile(self, signature, options, context):  # a reshaped hook
        raise AssertionError("never called")

    monkeypatch.setattr(ct, "__version__", "1.8.0")
    monkeypatch.setattr(ct.kernel, "_compile", new_compile)
    monkeypatch.delattr(cext, "get_driver_version")
    monkeypatch.setitem(cutile.BUILD_NAMES, "cuda.tile._compile", ("compile_tile", "gone_hook"))
    with pytest.raises(cutile.UnsupportedCuTileError) as err:
        cutile.check()
    message = str(err.value)
    for named in ("version 1.8.0", "kernel._compile", "cuda.tile._cext.get_driver_version",
                  "cuda.tile._compile.gone_hook", "cuda-tile[tileiras]==1.7.0"):
        assert named in message
    assert "compile_tile" not in message  # present hooks are not named


def test_hooks_read_the_kernel() -> None:
    kernel = ct.kernel(cutile._probe)
    assert cutile.pyfunc(kernel) is cutile._probe
    assert cutile.constant_params(kernel) == {"N"}
    assert {"occupancy", "num_ctas"} <= set(vars(cutile.compiler_options(kernel)))


def test_compiles_are_counted_per_thread_by_one_wrapper() -> None:
    """`compiles_in_this_thread` wraps cuTile's ``compile_tile`` once for the process and
    counts each thread's calls apart: another thread's compile is not this one's."""
    import threading

    before = cutile.compiles_in_this_thread()
    cutile.compiles_in_this_thread()  # a second reader installs no second wrapper
    other: list[int] = []

    def compile_elsewhere() -> None:
        start = cutile.compiles_in_this_thread()
        with pytest.raises(TypeError):  # not a function: cuTile refuses it
            cutile.compiler().compile_tile(None, (), "sm_90", None, None)
        other.append(cutile.compiles_in_this_thread() - start)

    thread = threading.Thread(target=compile_elsewhere)
    thread.start()
    thread.join()
    assert other == [1]
    assert cutile.compiles_in_this_thread() == before


def test_serving_kernel_serves_through_the_compile_hook() -> None:
    """The dispatcher's ``_compile`` on a `ServingKernel` asks `serve` with the `Arch` of the
    capability it is given, and hands back cuTile's 4-tuple."""
    seen = []

    class Served(cutile.ServingKernel):
        def serve(self, signature, context, arch):
            seen.append((signature, arch))
            return b"cubin", "symbol"

    kernel = Served(cutile._probe)
    assert kernel._compile("sig", None, (10, 0)) == (b"cubin", "symbol", None, ())
    assert seen == [("sig", "sm_100")] and seen[0][1].cc == 100
