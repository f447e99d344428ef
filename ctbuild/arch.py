"""Target GPU architectures (``sm_90``), validated against what tileiras 13.4 can target."""
from __future__ import annotations

#: Compute capabilities tileiras 13.4 targets (sm_80 .. sm_121).
KNOWN_CC = (80, 86, 87, 89, 90, 100, 103, 110, 120, 121)


class Arch(str):
    """An ``sm_XY`` name that constraints can compare: ``arch.cc >= 100``, ``arch == "sm_90"``."""

    cc: int

    def __new__(cls, name: str) -> Arch:
        text = str(name).strip().lower()
        digits = text.removeprefix("sm_")
        if not digits.isdigit() or int(digits) not in KNOWN_CC:
            known = ", ".join(f"sm_{c}" for c in KNOWN_CC)
            raise ValueError(f"unknown GPU arch {name!r}; tileiras targets: {known}")
        self = super().__new__(cls, f"sm_{digits}")
        self.cc = int(digits)
        return self

    @property
    def major(self) -> int:
        return self.cc // 10

    @property
    def minor(self) -> int:
        return self.cc % 10

    @classmethod
    def from_capability(cls, major: int, minor: int) -> Arch:
        return cls(f"sm_{major}{minor}")


def parse_archs(text: str | list[str] | tuple[str, ...]) -> list[Arch]:
    """``"sm_90,sm_100"`` or a list -> validated, de-duplicated, in order."""
    items = text.split(",") if isinstance(text, str) else list(text)
    out: list[Arch] = []
    for item in items:
        if str(item).strip():
            arch = Arch(item)
            if arch not in out:
                out.append(arch)
    if not out:
        raise ValueError("no target arch given (e.g. --arch sm_90,sm_100)")
    return out
