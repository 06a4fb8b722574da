"""A Containerfile's instructions, as the tests read them."""

from __future__ import annotations

from pathlib import Path

__all__ = ["instructions", "stages"]


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    found: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        text = pending + line
        pending = ""
        instruction, _, arguments = text.partition(" ")
        found.append((instruction.upper(), arguments.strip()))
    return found


def stages(path: Path) -> list[list[tuple[str, str]]]:
    """The instructions of each stage, its FROM first."""
    split: list[list[tuple[str, str]]] = []
    for instruction in instructions(path):
        if instruction[0] == "FROM":
            split.append([])
        split[-1].append(instruction)
    return split
