"""`python -m ctbuild.cache ...` (the `ctbuild cache` subcommands) in real subprocesses, with --json."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ctbuild.cache import Store
from ctbuild.cache.cli import parse_size

REPO = Path(__file__).resolve().parents[2]


def cli(*args: str, env: dict | None = None, cwd: Path = REPO) -> tuple[int, object, str]:
    full_env = {k: v for k, v in os.environ.items() if k != "CTBUILD_CACHE_DIR"}
    full_env.update({"PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1", **(env or {})})
    proc = subprocess.run([sys.executable, "-m", "ctbuild.cache", *args], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=60)
    out = json.loads(proc.stdout) if "--json" in args and proc.stdout.strip() else proc.stdout
    return proc.returncode, out, proc.stderr


def cubin(i: int) -> bytes:
    return bytes([i % 251]) * (4096 + 1024 * i)


@pytest.fixture
def cache(tmp_path) -> Path:
    root = tmp_path / "cache"
    with Store(root) as store:
        for i in range(6):
            store.put_compile(f"key{i:02d}" + "x" * 40, cubin(i), symbol=f"sym{i}",
                              meta={"kernel": "matmul" if i < 4 else "softmax", "arch": "sm_90" if i % 2 else "sm_100",
                                    **({"class": "relaxed"} if i == 5 else {})})
        store.put_tuning("tune-matmul", {"kernel": "matmul", "arch": "sm_90", "compile_key": "key01" + "x" * 40})
    return root


def test_stats_ls_and_default_dir_resolution(cache, tmp_path):
    code, out, _ = cli("stats", "--cache", str(cache), "--json")
    assert code == 0 and out["compile_entries"] == 6 and out["tuning_records"] == 1
    assert out["bytes"] == sum(len(cubin(i)) for i in range(6))
    code, out, _ = cli("stats", "--json", env={"CTBUILD_CACHE_DIR": str(cache)})
    assert code == 0 and out["path"] == str(cache)
    code, _, stderr = cli("stats", cwd=cache.parent)  # no --cache, no env: ./.ctbuild-cache, which is absent
    assert code == 2 and "no cache at .ctbuild-cache" in stderr
    (cache.parent / ".ctbuild-cache").symlink_to(cache)
    code, out, _ = cli("stats", "--json", cwd=cache.parent)
    assert code == 0 and out["compile_entries"] == 6

    code, out, _ = cli("ls", "--cache", str(cache), "--json", "--kernel", "matmul")
    assert code == 0 and len(out["compile"]) == 4 and [t["compile_key"] for t in out["tuning"]] == ["key01" + "x" * 40]
    assert {c["symbol"] for c in out["compile"]} == {"sym0", "sym1", "sym2", "sym3"}
    code, text, _ = cli("ls", "--cache", str(cache), "--arch", "sm_90")
    assert code == 0 and "3 compile entries, 1 tuning records" in text and "key01xxxxxxxxxxx " in text
    # the signature class column: recorded, else exact (what entries written before classes are)
    classes = {line.split()[1]: line.split()[3] for line in text.splitlines() if line.startswith("compile ")}
    assert classes == {"matmul": "exact", "softmax": "relaxed"}
    assert text.splitlines()[0].split()[:4] == ["KIND", "KERNEL", "ARCH", "CLASS"]


def test_verify_clean_then_corrupt_then_repair(cache):
    code, out, _ = cli("verify", "--cache", str(cache), "--json")
    assert code == 0 and out["ok"] and out["checked"]["blobs"] == 6
    victim = next(p for p in cache.glob("blobs/??/??/*.val") if p.read_bytes() == cubin(1))
    victim.write_bytes(victim.read_bytes()[:-1] + b"\x00")
    code, out, _ = cli("verify", "--cache", str(cache), "--json")
    assert code == 1 and not out["ok"]
    assert sorted(p["kind"] for p in out["problems"]) == ["corrupt_blob", "missing_blob"]
    code, text, _ = cli("verify", "--cache", str(cache))
    assert code == 1 and "corrupt_blob" in text and "--repair" in text
    code, out, _ = cli("verify", "--cache", str(cache), "--json", "--repair")
    assert code == 1 and out["repaired"] == 2
    code, out, _ = cli("verify", "--cache", str(cache), "--json")
    # the tuning record named the removed entry: reported until precompile/tune rebuild it
    assert code == 1 and [p["kind"] for p in out["problems"]] == ["missing_winner"]


def test_gc_rm_export_import(cache, tmp_path):
    code, out, _ = cli("gc", "--cache", str(cache), "--json", "--size-limit", "4K")
    assert code == 0 and out["size_limit"] == 4 * 1024 and out["limit_met"] is False  # the tuned winner stays
    assert out["evicted_entries"] == 5 and out["bytes_after"] == len(cubin(1))
    code, out, _ = cli("rm", "matmul", "--cache", str(cache), "--json")
    assert code == 0 and out == {"removed": 2}  # the winner's entry and its tuning record
    code, out, stderr = cli("rm", "matmul", "--cache", str(cache), "--json")
    assert code == 1 and out == {"removed": 0}

    with Store(cache) as store:
        store.put_compile("a", b"A" * 100, symbol="s", meta={"kernel": "k", "arch": "sm_90"})
        store.put_compile("b", b"B" * 100, symbol="s", meta={"kernel": "k", "arch": "sm_100"})
    bundle = tmp_path / "out.tgz"
    code, out, _ = cli("export", str(bundle), "--arch", "sm_90", "--cache", str(cache), "--json")
    assert code == 0 and out["compile_entries"] == 1 and out["archs"] == ["sm_90"] and bundle.exists()
    code, out, _ = cli("import", str(bundle), "--cache", str(tmp_path / "new"), "--json")
    assert code == 0 and out["blobs_added"] == 1 and out["entries_written"] == 1
    code, out, _ = cli("import", str(bundle), "--cache", str(tmp_path / "new"), "--json")
    assert code == 0 and out["entries_written"] == 0 and out["entries_unchanged"] == 1
    assert Store(tmp_path / "new").get_compile("a").cubin == b"A" * 100


def test_bad_input_exits_2_with_a_message(cache, tmp_path):
    code, _, stderr = cli("gc", "--cache", str(cache), "--size-limit", "lots")
    assert code == 2 and "invalid size" in stderr
    code, out, stderr = cli("stats", "--cache", str(tmp_path / "nope"), "--json")
    assert code == 2 and "no cache at" in out["error"] and "CTBUILD_CACHE_DIR" in stderr
    (tmp_path / "bad.tar").write_bytes(b"junk")
    code, out, _ = cli("import", str(tmp_path / "bad.tar"), "--cache", str(cache), "--json")
    assert code == 2 and "not a readable tar" in out["error"]
    code, _, stderr = cli("export", str(tmp_path / "no" / "dir.tar"), "--cache", str(cache))
    assert code == 2 and "cannot write bundle" in stderr
    code, _, stderr = cli("frobnicate")
    assert code == 2 and "invalid choice" in stderr


def test_a_refused_import_leaves_nothing_behind(tmp_path):
    """"nothing was imported" is true of the disk: no empty cache where there was none, nor
    in an empty directory (a fresh volume) it was pointed at; the message is one line."""
    (tmp_path / "bad.tgz").write_bytes(b"junk")
    code, _, stderr = cli("import", str(tmp_path / "bad.tgz"), "--cache", str(tmp_path / "a" / "new"))
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert "not a readable tar bundle (neither tar nor tar.gz, .bz2 or .xz); nothing was imported" in stderr
    assert not (tmp_path / "a").exists()
    volume = tmp_path / "volume"
    volume.mkdir()
    (volume / "README").write_text("mine")
    code, _, _ = cli("import", str(tmp_path / "bad.tgz"), "--cache", str(volume))
    assert code == 2 and sorted(os.listdir(volume)) == ["README"]


def test_ls_refuses_a_misspelt_arch(cache):
    code, out, stderr = cli("ls", "--cache", str(cache), "--arch", "sm90")
    assert code == 2 and not out and "invalid --arch 'sm90': archs are spelt sm_XY (did you mean 'sm_90'?)" in stderr
    code, out, _ = cli("ls", "--cache", str(cache), "--arch", "sm_90", "--json")
    assert code == 0 and {e["arch"] for e in out["compile"]} == {"sm_90"}


def test_help_teaches_with_examples():
    code, text, _ = cli("--help")
    assert code == 0 and "examples:" in text and "ctbuild cache gc --size-limit 2G" in text


@pytest.mark.parametrize("text, expected", [("2G", 2 * 2**30), ("512M", 512 * 2**20), ("1.5GiB", 3 * 2**29),
                                            ("1000", 1000), ("4k", 4096)])
def test_parse_size(text, expected):
    assert parse_size(text) == expected
