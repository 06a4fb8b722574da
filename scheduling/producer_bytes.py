"""What producers (map tasks) wrote to each subpartition, as consumer plans read it."""

from __future__ import annotations

import abc
from collections.abc import Sequence

import numpy
import numpy.typing

__all__ = ["MatrixBytes", "ProducerBytes"]

Bytes = numpy.typing.NDArray[numpy.int64]


class ProducerBytes(abc.ABC):
    """The bytes each producer wrote to each subpartition, as a plan reads them: totals per
    subpartition and per producer, and every producer's bytes at a few subpartitions (the
    skewed ones). An implementation need never hold producers x subpartitions numbers: at
    1,000 x 4,000 a matrix of them is 32 MB, and a driver plans many stages."""

    @property
    @abc.abstractmethod
    def shape(self) -> tuple[int, int]:
        """(producers, subpartitions)."""

    @abc.abstractmethod
    def subpartition_totals(self) -> Bytes:
        """Per subpartition, the bytes of every producer."""

    @abc.abstractmethod
    def producer_totals(self) -> Bytes:
        """Per producer, the bytes of every subpartition."""

    @abc.abstractmethod
    def columns(self, subpartitions: Sequence[int]) -> Bytes:
        """``(producers, len(subpartitions))``: each producer's bytes at those subpartitions."""


class MatrixBytes(ProducerBytes):
    """A whole ``(producers, subpartitions)`` matrix of bytes, held as given."""

    def __init__(self, matrix: Bytes) -> None:
        self._matrix = matrix

    @property
    def shape(self) -> tuple[int, int]:
        producers, subpartitions = self._matrix.shape
        return int(producers), int(subpartitions)

    def subpartition_totals(self) -> Bytes:
        totals: Bytes = self._matrix.sum(axis=0, dtype=numpy.int64)
        return totals

    def producer_totals(self) -> Bytes:
        totals: Bytes = self._matrix.sum(axis=1, dtype=numpy.int64)
        return totals

    def columns(self, subpartitions: Sequence[int]) -> Bytes:
        return self._matrix[:, list(subpartitions)]
