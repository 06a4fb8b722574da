"""``external_shuffle.daemon.main``: the level the daemon logs at, from --log-level, the
environment or the config file, in that order."""

from __future__ import annotations

from pathlib import Path

import pytest

from external_shuffle.daemon.main import load_configuration
from external_shuffle.options import LOG_LEVEL


# (config file, PYSHUFFLE_* variable, --log-level) -> the level the daemon logs at.
@pytest.mark.parametrize(
    ("sources", "level"),
    [
        ((None, None, None), "info"),
        (("warning", None, None), "warning"),
        (("warning", "debug", None), "debug"),
        (("warning", "debug", "error"), "error"),
    ],
)
def test_the_flag_wins_over_the_environment_which_wins_over_the_file(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    sources: tuple[str | None, str | None, str | None],
    level: str,
) -> None:
    in_file, in_environment, flag = sources
    config = tmp_path / "daemon.toml"
    config.write_text(f'"{LOG_LEVEL.key}" = "{in_file}"\n' if in_file else "")
    monkeypatch.delenv(LOG_LEVEL.env_name, raising=False)
    if in_environment is not None:
        monkeypatch.setenv(LOG_LEVEL.env_name, in_environment)
    assert load_configuration(str(config), flag).get(LOG_LEVEL) == level
