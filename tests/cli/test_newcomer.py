"""A newcomer's mistakes end at `ctbuild plan`: one line naming the problem (with a "did you
mean" where one fits), exit 2, before anything is compiled. Each goes through the CLI's own
``main`` in this process: the code a ``ctbuild`` subprocess runs, without paying torch's and
cuTile's import per case."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import ROOT

from ctbuild.cli import main

FIXTURE = ROOT / "tests" / "fixtures" / "newcomer_project"
CONFIG = FIXTURE / "ctbuild.toml"
sys.path.insert(0, str(FIXTURE))
from mistakes import GOOD, MISTAKES, TEMPLATE  # noqa: E402


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``ctbuild ARGV`` in-process: (exit status, stdout, stderr)."""
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse rejects a flag
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def one_error(code: int, err: str, expected: str) -> None:
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 or "usage:" in err, err  # one line (argparse adds its usage)
    assert expected in err and "Traceback" not in err, err


#: Arguments of the wrong type, as `MISTAKES` (the fixture's) are written.
TYPE_MISTAKES = {
    "default_str": ({"default": '"TILE=16"'},
                    "default must be a dict of axis values (or a function default(w) returning "
                    "one), got a str 'TILE=16'; e.g. default={'TILE': 16}"),
    "product_dict": ({"space": 'Product({"TILE": [16, 32]})'},
                     "Product takes axes as keywords (Product(TM=[64, 128])) and Zip groups, got "
                     "the dict {'TILE': [16, 32]}; write Product(**{'TILE': [16, 32]})"),
    "axis_float": ({"space": "Product(TILE=[16.0, 32.0])"},
                   "axis 'TILE' has the value 16.0 (a float), but the kernel parameter TILE is "
                   "an int (TILE: ct.Constant[int]); give the axis int values"),
}


@pytest.mark.parametrize("mistake", sorted({**MISTAKES, **TYPE_MISTAKES}))
def test_declaration_mistake_fails_plan_at_import(tmp_path: Path, capsys, mistake: str) -> None:
    changes, expected = {**MISTAKES, **TYPE_MISTAKES}[mistake]
    module = f"newcomer_{mistake}"
    (tmp_path / f"{module}.py").write_text(TEMPLATE.format(**{**GOOD, **changes}))
    config = tmp_path / "ctbuild.toml"
    config.write_text(f'modules = ["{module}"]\n')
    code, out, err = cli(capsys, "plan", "--config", str(config))
    one_error(code, err, expected)
    assert not out


def test_one_dim_name_with_two_bucket_lists_shows_both(tmp_path: Path, capsys) -> None:
    """Equal ranges, other buckets: the message shows what differs."""
    text = TEMPLATE.format(**GOOD).replace(
        '"Y": Tensor((N, 256), "float32")', '"Y": Tensor((Dim("rows", 1, 4096), 256), "float32")'
    ).replace("N = 1024", 'N = Dim("rows", 1, 4096, buckets=[64])')
    (tmp_path / "newcomer_dims.py").write_text(text)
    (tmp_path / "ctbuild.toml").write_text('modules = ["newcomer_dims"]\n')
    code, _, err = cli(capsys, "plan", "--config", str(tmp_path / "ctbuild.toml"))
    one_error(code, err, "Dim 'rows' is declared twice, differently: Dim('rows', 1, 4096, "
                         "buckets=(64, 4096)) and Dim('rows', 1, 4096); declare it once")


CONFIG_MISTAKES = {
    "key_dash": ('cache-dir = "c"', "unknown key 'cache-dir' (did you mean 'cache_dir'?); "
                                    "known keys: modules, archs, cache_dir,"),
    "key_singular": ('arch = ["sm_90"]', "unknown key 'arch' (did you mean 'archs'?)"),
    "cap_str": ('cap = "1"', "'cap' must be an int, got '1'"),
    "cap_zero": ("cap = 0", "cap must be a whole number >= 1 (the most configs per kernel, "
                            "workload and arch), got an int 0"),
    "device_field": ("[devices]\nsm_90 = { sm_cnt = 132 }",
                     "[devices] sm_90 has unknown field 'sm_cnt' (did you mean 'sm_count'?); "
                     "fields: name, sm_count"),
}


@pytest.mark.parametrize("mistake", sorted(CONFIG_MISTAKES))
def test_config_mistake_is_named(tmp_path: Path, capsys, mistake: str) -> None:
    """A misspelt ctbuild.toml key or [devices] field gets a "did you mean"."""
    line, expected = CONFIG_MISTAKES[mistake]
    config = tmp_path / "ctbuild.toml"
    config.write_text(f'modules = ["newcomer_kernels"]\n{line}\n')
    code, out, err = cli(capsys, "plan", "--config", str(config))
    one_error(code, err, f"{config}: {expected}")
    assert not out


@pytest.mark.parametrize("kernel,expected", [
    ("triton_habits", "axis 'num_warps' reaches nothing (no kernel parameter, no cuTile hint, "
                      "not read by grid/args/hints)"),
    ("triton_habits", "Triton's num_warps has no cuTile counterpart; cuTile's compiler hints "
                      "are occupancy, num_ctas, num_worker_warps, opt_level"),
    ("four_d_grid", "grid (1, 1, 1, 1) has 4 dimensions; cuTile launches 1 to 3"),
    ("huge_range", "X has a size or stride of 2147483648, beyond cuTile's int32 index "
                   "range; annotate the parameter X with ct.IndexedWithInt64"),
    ("tall_grid", "grid (1, 70000): dimension 1 has 7e+04 blocks, above CUDA's limit 65535"),
    ("body_typo", "kernel body: tests/fixtures/newcomer_project/newcomer_kernels.py:"),
    ("body_typo", "Undefined variable scale"),
    ("scale_rowz", "--kernel scale_rowz: no such kernel in this project (did you mean "
                   "'scale_rows'?)"),
])
def test_plan_time_mistake(capsys, monkeypatch, kernel: str, expected: str) -> None:
    monkeypatch.chdir(ROOT)
    code, out, err = cli(capsys, "plan", "--config", str(CONFIG), "--kernel", kernel)
    one_error(code, err, expected)


def test_arch_typos_blame_the_flag(tmp_path: Path, capsys, monkeypatch) -> None:
    code, _, err = cli(capsys, "plan", "--config", str(CONFIG), "--arch", "sm90",
                       "--kernel", "scale_rows")
    one_error(code, err, "--arch sm90: unknown GPU arch 'sm90'")
    assert "(did you mean 'sm_90'?)" in err and "ctbuild.toml" not in err
    bundle = tmp_path / "b.tgz"
    code, _, err = cli(capsys, "cache", "export", "--cache", str(tmp_path / "c"), "--arch",
                       "sm90", str(bundle))
    one_error(code, err, "argument --arch: invalid --arch 'sm90': archs are spelt sm_XY")
    assert not bundle.exists() and not (tmp_path / "c").exists()
    code, out, err = cli(capsys, "cache", "ls", "--cache", str(tmp_path / "c"), "--arch", "sm90")
    one_error(code, err, "invalid --arch 'sm90': archs are spelt sm_XY (did you mean 'sm_90'?)")
    assert not out


def test_good_kernel_plans_with_costs_and_bucket_advice(capsys) -> None:
    code, out, err = cli(capsys, "plan", "--config", str(CONFIG), "--kernel", "scale_rows")
    assert code == 0, err
    assert "estimated cost" in out and "tile sizes" in out
    assert "note: scale_rows: Dim 'rows' (1..8192) has 14 buckets" in out
    assert "Dim('rows', 1, 8192, buckets=[2, 8, 32, 128, 512, 2048, 8192])" in out
    assert "triton_habits" not in out  # --kernel: the others are neither planned nor checked


def test_precompile_without_ray_builds_on_local_workers(tmp_path: Path, capsys, monkeypatch
                                                        ) -> None:
    """A serving install has no Ray: precompile says so once and builds on local processes;
    --address then is a clear flag error. A body error is reported once, with file:line."""
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails, as with no Ray
    monkeypatch.chdir(ROOT)
    cache = tmp_path / "c"
    code, _, err = cli(capsys, "precompile", "--config", str(CONFIG), "--kernel", "body_typo",
                       "--cache", str(cache))
    one_error(code, err.replace("note: Ray", ""), "kernel body: tests/fixtures/newcomer_project/")
    code, _, err = cli(capsys, "precompile", "--config", str(CONFIG), "--kernel", "one_tile",
                       "--cache", str(cache), "--address", "10.0.0.5:6379")
    one_error(code, err, "--address 10.0.0.5:6379 needs Ray, which is not installed here")
    code, out, err = cli(capsys, "precompile", "--config", str(CONFIG), "--kernel", "one_tile",
                         "--cache", str(cache), "--workers", "2")
    assert code == 0, out + err
    assert out.count("Ray is not installed here") == 1, out
    assert "local worker processes, no Ray" in out and "2 compiled, 0 cached, 0 failed" in out
    code, out, err = cli(capsys, "precompile", "--config", str(CONFIG), "--kernel", "one_tile",
                         "--cache", str(cache))
    assert code == 0 and "0 compiled, 2 cached, 0 failed" in out, out + err
    assert "(nothing to compile: no worker started)" in out, out



def test_failed_compile_shows_the_compilers_reason() -> None:
    """tileiras' own stderr, on the one line a build report shows (not "Return code 3")."""
    from cuda.tile._compiler_options import CompilerOptions

    from ctbuild.compile.compiler import TileirasError, _tileiras
    from ctbuild.cutile import FrontEnd
    from ctbuild.tileir import TileIR
    with pytest.raises(TileirasError) as info:
        _tileiras(TileIR(FrontEnd(b"not bytecode"), "x"), CompilerOptions(), "sm_90", 60)
    text = str(info.value)
    assert text.startswith("tileiras exit ") and "\n" not in text
    assert "input does not correspond to Tile IR bytecode" in text
