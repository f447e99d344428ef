"""A small reader of examples/Dockerfile: its stages, their ARG/ENV values and steps.

Shared by tests/cli/test_container_flow.py (which replays the stages) and tests/docs/test_docs.py
(which checks the commands the Dockerfile runs)."""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "examples" / "Dockerfile"


@dataclass
class Stage:
    name: str
    base: str
    steps: list[tuple[str, str]] = field(default_factory=list)  # (instruction, raw arguments)
    args: dict[str, str] = field(default_factory=dict)          # ARG/ENV values, resolved

    def runs(self) -> list[str]:
        return [strip_run_flags(a) for op, a in self.steps if op == "RUN"]

    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for op, a in self.steps:
            if op == "ENV":
                out.update(parse_kv(a, self.args))
        return out


def substitute(text: str, values: dict[str, str]) -> str:
    """Docker's ${VAR}, ${VAR:-default} and $VAR, from `values` (unknown -> empty)."""
    def repl(m: re.Match) -> str:
        name = m.group(1) or m.group(3)
        default = m.group(2)
        value = values.get(name, "")
        return value if value else (default or "")
    return re.sub(r"\$\{(\w+)(?::-([^}]*))?\}|\$(\w+)", repl, text)


def parse_kv(text: str, values: dict[str, str]) -> dict[str, str]:
    out = {}
    for token in shlex.split(text):
        key, _, value = token.partition("=")
        out[key] = substitute(value, {**values, **out})
    return out


def strip_run_flags(args: str) -> str:
    """A RUN's command without BuildKit flags (--mount=..., --network=...)."""
    tokens = args.split()
    while tokens and tokens[0].startswith("--"):
        tokens.pop(0)
    return " ".join(tokens)


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, current = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            current += stripped[:-1].rstrip() + " "
            continue
        current += stripped
        op, _, rest = current.partition(" ")
        out.append((op.upper(), re.sub(r"\s+", " ", rest.strip())))
        current = ""
    return out


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARGs and the stages, with ARG/ENV values resolved per stage."""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for op, rest in instructions(text):
        if op == "FROM":
            parts = rest.split()
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else str(len(stages))
            stages.append(Stage(name, substitute(parts[0], global_args)))
            continue
        if not stages:
            assert op == "ARG", f"{op} before the first FROM"
            key, _, value = rest.partition("=")
            global_args[key] = value
            continue
        stage = stages[-1]
        stage.steps.append((op, rest))
        if op == "ARG":
            key, _, value = rest.partition("=")
            stage.args[key] = substitute(value, stage.args) if value else global_args.get(key, "")
        elif op == "ENV":
            stage.args.update(parse_kv(rest, stage.args))
    return global_args, stages


def stages_by_name() -> dict[str, Stage]:
    return {s.name: s for s in parse_dockerfile(DOCKERFILE.read_text())[1]}


def script_defaults(path: Path) -> dict[str, str]:
    """VAR=${VAR:-default} lines of a shell script."""
    return dict(re.findall(r"^(\w+)=\$\{\1:-([^}]*)\}$", path.read_text(), re.M))
