"""A distribution installed into a PYTHONPATH directory (``pip install --target DIR``) is a
library, like site-packages, and its tile helpers are followed by their code: an edit copied
over it without a version bump changes the key (issue 37), the place it is installed in does
not. A project module beside it (no distribution owns it) is followed too. cuTile itself is
never followed, wherever it lives: its version is in the toolchain fingerprint."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from ctbuild.fingerprint import is_library_module, kernel_fingerprint

MODULES = ("tlib_pkg", "proj_mod", "kern_mod")


def _fingerprint(root: Path, helper_body: str, installed: bool,
                 monkeypatch: pytest.MonkeyPatch) -> tuple[str, bool, bool]:
    """(fingerprint of kern_mod.kernel, tlib_pkg is a library, proj_mod is a library)."""
    (root / "tlib_pkg").mkdir(parents=True)
    (root / "tlib_pkg" / "__init__.py").write_text(f"def helper(x):\n    return {helper_body}\n")
    (root / "proj_mod.py").write_text("def helper(x):\n    return x\n")
    (root / "kern_mod.py").write_text("import proj_mod\nimport tlib_pkg\n\n\ndef kernel(x):\n"
                                      "    return tlib_pkg.helper(x) + proj_mod.helper(x)\n")
    if installed:
        info = root / "tlib_pkg-1.0.dist-info"
        info.mkdir()
        (info / "RECORD").write_text("tlib_pkg/__init__.py,sha256=x,10\n"
                                     "tlib_pkg-1.0.dist-info/RECORD,,\n")
    monkeypatch.syspath_prepend(str(root))
    for name in MODULES:
        sys.modules.pop(name, None)
    try:
        kernel = importlib.import_module("kern_mod").kernel
        return (kernel_fingerprint(kernel), is_library_module("tlib_pkg"),
                is_library_module("proj_mod"))
    finally:
        for name in MODULES:
            sys.modules.pop(name, None)


@pytest.mark.parametrize("installed", [True, False])
def test_installed_distribution_is_a_library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             installed: bool) -> None:
    with monkeypatch.context() as m:
        one, lib, proj = _fingerprint(tmp_path / "a", "x * 2", installed, m)
    with monkeypatch.context() as m:
        moved, _, _ = _fingerprint(tmp_path / "elsewhere" / "b", "x * 2", installed, m)
    with monkeypatch.context() as m:
        two, _, _ = _fingerprint(tmp_path / "c", "x * 3", installed, m)
    assert not proj  # the project module beside it is followed either way
    assert lib is installed
    assert one == moved and one != two  # by its code, not by where it is installed


def test_cutile_is_never_followed() -> None:
    import cuda.tile as ct

    from ctbuild.fingerprint_libraries import installed_module
    assert is_library_module("cuda.tile") and not installed_module(ct)
