"""The ``pyshuffle`` command as a user runs it, from the tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping

from shuffle_api.config import ENV_PREFIX

__all__ = ["WITHOUT_PYSHUFFLE_VARIABLES", "pyshuffle"]

_MAIN = "import sys; from shuffle_runtime.cli import main; sys.exit(main())"

WITHOUT_PYSHUFFLE_VARIABLES: Mapping[str, str | None] = dict.fromkeys(
    (name for name in os.environ if name.startswith(ENV_PREFIX)), None
)
"""For ``env``: unsets the PYSHUFFLE_* variables this run may have set (a daemon's
configuration refuses those it does not know)."""


def pyshuffle(
    *args: str, env: Mapping[str, str | None] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``pyshuffle ARGS`` with ``env`` over this process's environment (None: unset)."""
    merged = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", _MAIN, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={name: value for name, value in merged.items() if value is not None},
        check=False,
    )
