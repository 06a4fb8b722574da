"""Identifiers. Every id may become a path component on a store, so each is validated."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

from shuffle_api.errors import InvalidIdentifierError

__all__ = [
    "IntermediateResultPartitionID",
    "ResultPartitionID",
    "new_id",
    "validate_id",
]

_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


_SHOWN = 140


def _prefix(value: object) -> str:
    """A prefix only: the value may be anything a client sent, of any length."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) <= _SHOWN:
        return repr(text)
    return f"{text[:_SHOWN]!r}... ({len(text)} characters)"


def validate_id(value: str, what: str) -> str:
    """Return ``value`` if it is a safe id, else raise :class:`InvalidIdentifierError`.

    Safe: 1-128 characters of letters, digits, ``_ . -``, not starting with ``.`` or ``-``,
    and never ``..`` - so no id can name a path outside the directory it lives in.
    """
    if not isinstance(value, str) or not _ID_PATTERN.fullmatch(value) or ".." in value:
        raise InvalidIdentifierError(
            f"invalid {what} {_prefix(value)}: use 1-128 characters of letters, digits, '_',"
            " '.', '-', starting with a letter or digit, without '..'"
        )
    return value


def new_id() -> str:
    """A fresh random id (32 hex digits)."""
    return uuid.uuid4().hex


@dataclass(frozen=True, slots=True, order=True)
class IntermediateResultPartitionID:
    """Partition ``partition_index`` of the intermediate result ``result_id``."""

    result_id: str
    partition_index: int

    def __post_init__(self) -> None:
        validate_id(self.result_id, "result id")
        if not isinstance(self.partition_index, int) or self.partition_index < 0:
            raise InvalidIdentifierError(
                f"invalid partition index {self.partition_index!r}: must be an int >= 0"
            )

    def __str__(self) -> str:
        return f"{self.result_id}#{self.partition_index}"


@dataclass(frozen=True, slots=True, order=True)
class ResultPartitionID:
    """One producer attempt's copy of a partition: each attempt writes its own."""

    partition_id: IntermediateResultPartitionID
    producer_attempt_id: str

    def __post_init__(self) -> None:
        validate_id(self.producer_attempt_id, "producer attempt id")

    def __str__(self) -> str:
        return f"{self.partition_id}@{self.producer_attempt_id}"
