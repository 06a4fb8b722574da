"""The wire version: which revision of the ``pyshuffle.v1`` API a client speaks.

Every call of this pyshuffle's clients carries it in the metadata header ``pyshuffle-wire``;
a daemon serves every version from ``OLDEST_WIRE_VERSION`` to its own and refuses a newer one
with UnsupportedFormatVersionError, naming both (the client's calls then fail at once, typed,
rather than in a message the daemon misreads). A call without the header is version 1.

Versions (a new one whenever a change is one an older peer would misread):
  1. ``pyshuffle.v1`` as it was before calls carried a version.
  2. Calls carry the version; nothing else changed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from shuffle_api import UnsupportedFormatVersionError

__all__ = ["OLDEST_WIRE_VERSION", "WIRE_VERSION", "WIRE_VERSION_HEADER", "wire_version_of"]

WIRE_VERSION: Final = 2
OLDEST_WIRE_VERSION: Final = 1
WIRE_VERSION_HEADER: Final = "pyshuffle-wire"
_UNVERSIONED: Final = 1


def wire_version_of(metadata: Iterable[tuple[str, str | bytes]]) -> int:
    """The wire version a call's metadata names, checked against this pyshuffle's."""
    named = dict(metadata).get(WIRE_VERSION_HEADER, str(_UNVERSIONED))
    text = named.decode("ascii", "replace") if isinstance(named, bytes) else named
    if not text.isdigit() or len(text) > 6:
        raise UnsupportedFormatVersionError(
            f"wire version {text[:40]!r} is not a version (header {WIRE_VERSION_HEADER})"
        )
    version = int(text)
    if not OLDEST_WIRE_VERSION <= version <= WIRE_VERSION:
        raise UnsupportedFormatVersionError(
            f"the client speaks wire version {version}; this daemon serves versions"
            f" {OLDEST_WIRE_VERSION} to {WIRE_VERSION}: run clients and daemons of versions"
            " that overlap (see CHANGELOG.md, Compatibility)"
        )
    return version
