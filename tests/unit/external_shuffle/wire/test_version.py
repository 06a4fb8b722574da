"""The wire version a call names: none is version 1; a daemon serves its range only."""

from __future__ import annotations

import pytest

from external_shuffle.wire.version import (
    OLDEST_WIRE_VERSION,
    WIRE_VERSION,
    WIRE_VERSION_HEADER,
    wire_version_of,
)
from shuffle_api import UnsupportedFormatVersionError


def test_a_call_without_the_header_is_version_1_and_every_served_version_passes() -> None:
    assert wire_version_of([("authorization", "Bearer x")]) == 1
    for version in range(OLDEST_WIRE_VERSION, WIRE_VERSION + 1):
        assert wire_version_of([(WIRE_VERSION_HEADER, str(version))]) == version
        assert wire_version_of([(WIRE_VERSION_HEADER, str(version).encode())]) == version


@pytest.mark.parametrize("named", [str(WIRE_VERSION + 1), "0", "-1", "2.0", "", "9" * 5_000])
def test_a_version_outside_the_range_or_not_a_number_is_refused_naming_it(named: str) -> None:
    with pytest.raises(UnsupportedFormatVersionError) as refused:
        wire_version_of([(WIRE_VERSION_HEADER, named)])
    assert len(str(refused.value)) < 300
    assert str(WIRE_VERSION) in str(refused.value) or "not a version" in str(refused.value)
