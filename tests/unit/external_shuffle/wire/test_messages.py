"""``external_shuffle.wire.messages``: who an application is, as a client's message says."""

from __future__ import annotations

from external_shuffle.wire.messages import identity_from_pb
from external_shuffle.wire.stubs import pb
from shuffle_api import ApplicationIdentity


def test_who_an_application_is_keeps_only_printable_characters_and_256_of_them() -> None:
    """A client's strings reach operators' terminals and the logs: no escapes, no line breaks,
    no direction overrides."""
    message = pb.ApplicationIdentity(
        engine_id="local-1\n2026 forged log line", name="a\x1b[2Jb\u202ec", user="u" * 300
    )
    assert identity_from_pb(message) == ApplicationIdentity(
        "local-12026 forged log line", "a[2Jbc", "u" * 256
    )
