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
