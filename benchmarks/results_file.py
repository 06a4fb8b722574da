"""What every benchmark records beside its figures: the machine it ran on, and the results
file it writes."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

__all__ = ["machine", "save_results"]


def machine(**versions: str) -> dict[str, Any]:
    """The interpreter, the hardware, the load, and ``versions`` of the libraries measured."""
    return {
        "python": platform.python_version(),
        **versions,
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def save_results(path: Path, document: dict[str, Any]) -> None:
    """Write ``document`` as indented JSON to ``path`` and say where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    print(f"\nsaved {path}")
