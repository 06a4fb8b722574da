"""The default shuffle service: in process, no daemon."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from netty_like.environment import NettyShuffleEnvironment
from netty_like.master import NettyShuffleMaster
from netty_like.options import NETTY_OPTIONS
from shuffle_api import (
    ConfigOption,
    ShuffleEnvironmentContext,
    ShuffleMasterContext,
    ShuffleServiceFactory,
)

__all__ = ["NettyShuffleServiceFactory"]


class NettyShuffleServiceFactory(ShuffleServiceFactory):
    @classmethod
    def config_options(cls) -> Sequence[ConfigOption[Any]]:
        return NETTY_OPTIONS

    def create_shuffle_master(self, context: ShuffleMasterContext) -> NettyShuffleMaster:
        return NettyShuffleMaster(context)

    def create_shuffle_environment(
        self, context: ShuffleEnvironmentContext
    ) -> NettyShuffleEnvironment:
        return NettyShuffleEnvironment(context)
