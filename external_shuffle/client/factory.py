"""The external shuffle service's factory (``external_shuffle.ExternalShuffleServiceFactory``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from external_shuffle.client.environment import ExternalShuffleEnvironment
from external_shuffle.client.master import ExternalShuffleMaster
from external_shuffle.options import CLIENT_OPTIONS
from shuffle_api import (
    ConfigOption,
    ShuffleEnvironment,
    ShuffleEnvironmentContext,
    ShuffleMaster,
    ShuffleMasterContext,
    ShuffleServiceFactory,
)

__all__ = ["ExternalShuffleServiceFactory"]


class ExternalShuffleServiceFactory(ShuffleServiceFactory):
    """Clients of a running coordinator (``external-shuffle.coordinator.address``)."""

    @classmethod
    def config_options(cls) -> Sequence[ConfigOption[Any]]:
        return CLIENT_OPTIONS

    def create_shuffle_master(self, context: ShuffleMasterContext) -> ShuffleMaster:
        return ExternalShuffleMaster(context)

    def create_shuffle_environment(self, context: ShuffleEnvironmentContext) -> ShuffleEnvironment:
        return ExternalShuffleEnvironment(context)
