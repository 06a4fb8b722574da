"""The default shuffle service, in process: blocking partitions as sort-merge Arrow IPC files on an
fsspec store, pipelined partitions in bounded memory, and a TCP data port with credit-based flow
control for consumers in other processes."""

from netty_like.descriptor import NettyShuffleDescriptor
from netty_like.environment import NettyShuffleEnvironment
from netty_like.factory import NettyShuffleServiceFactory
from netty_like.master import NettyShuffleMaster
from netty_like.options import NETTY_OPTIONS

__all__ = [
    "NETTY_OPTIONS",
    "NettyShuffleDescriptor",
    "NettyShuffleEnvironment",
    "NettyShuffleMaster",
    "NettyShuffleServiceFactory",
]
