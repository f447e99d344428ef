"""`ctbuild cache prune` on a shared cache whose entries record an odd ``created`` (a string, a
list, Infinity, a time past year 9999): such an entry's write time is unknown, as for one that
records none, so the prune neither stops ("internal error") nor ranks it as the newest version."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ctbuild.cache import Store
from ctbuild.cache.jsontext import dumps

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "tests" / "fixtures" / "identity_project" / "ctbuild.toml"


def plant(cache: Path, key: str, fingerprint: str, created: str) -> None:
    """A compile entry of kernel idk at ``fingerprint`` whose stored ``created`` is the JSON text
    ``created``, written as another writer would (the store itself always records a number)."""
    with Store(cache) as store:
        digest = store.put_compile(key, os.urandom(2000), symbol="s",
                                   meta={"kernel": "idk", "kernel_fp": fingerprint, "arch": "sm_90"})
        entry = dict(store.compile_entries())[key]
        text = dumps({**entry, "created": "CREATED"}, what=key).replace('"CREATED"', created)
        store.namespaces.compile.set(key, text, tag=digest)


@pytest.mark.parametrize("created", ['"yesterday"', "[1]", "Infinity", "1e300"])
def test_prune_takes_an_odd_created_for_unknown(tmp_path: Path, created: str) -> None:
    cache = tmp_path / "cache"
    plant(cache, "odd", "old-odd", created)
    plant(cache, "newer", "old-newer", "5.0")
    plant(cache, "older", "old-older", "3.0")
    # none is the planned version: --keep 2 keeps the most recently written other one
    proc = subprocess.run([sys.executable, "-m", "ctbuild", "cache", "prune", "--config", str(CONFIG),
                           "--cache", str(cache), "--keep", "2"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "idk: keep old-newer (" in proc.stdout, proc.stdout
    assert "remove old-odd (unknown: 1 compile entries" in proc.stdout, proc.stdout
    with Store(cache, readonly=True) as store:
        assert {key for key, _ in store.compile_entries()} == {"newer"}
