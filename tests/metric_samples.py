"""The sample names a Prometheus metric family is exported under, by its type."""

from __future__ import annotations

from typing import Final

__all__ = ["sample_names"]

_SUFFIXES: Final = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_count", "_sum"),
    "info": ("_info",),
}


def sample_names(family: str, kind: str) -> set[str]:
    """``family``'s sample names (a counter's family may be named with ``_total`` or not)."""
    stem = family.removesuffix("_total") if kind == "counter" else family
    return {stem + suffix for suffix in _SUFFIXES.get(kind, ("",))}
