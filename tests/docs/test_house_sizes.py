"""The house rules on size (issue 28): no module of ctbuild/, farm/ or cache/ over 500 lines
and no function over 60 (docstring included), so that each reads as one concern and one step."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


def _modules() -> list[Path]:
    """Every module of the three packages, each once (ctbuild/farm and ctbuild/cache are links
    to farm/ and cache/)."""
    out = [p for p in (ROOT / "ctbuild").rglob("*.py") if p.parent.resolve() == p.parent
           and not any(part in ("farm", "cache") for part in p.relative_to(ROOT).parts[1:2])]
    return sorted(out + list((ROOT / "farm").rglob("*.py")) + list((ROOT / "cache").rglob("*.py")))


def test_the_scan_sees_all_three_packages() -> None:
    tops = {p.relative_to(ROOT).parts[0] for p in _modules()}
    assert tops == {"ctbuild", "farm", "cache"} and len(_modules()) > 60


def test_no_module_over_500_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for p in _modules()
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}, f"split these by concern: {long}"


def test_no_function_over_60_lines() -> None:
    long = {}
    for p in _modules():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if n > MAX_FUNCTION_LINES:
                    long[f"{p.relative_to(ROOT)}:{node.lineno} {node.name}"] = n
    assert long == {}, f"split these into named steps: {long}"
