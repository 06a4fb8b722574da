"""The external gRPC shuffle service: a daemon (coordinator + workers, ``pyshuffle daemon``)
whose partitions outlive the processes that wrote them, and the client side (factory, master,
environment) selected with
``shuffle-service-factory.class = external_shuffle.ExternalShuffleServiceFactory``."""

from external_shuffle.descriptor import ExternalShuffleDescriptor
from external_shuffle.factory import ExternalShuffleServiceFactory
from external_shuffle.wire import WorkerAddress

__all__ = ["ExternalShuffleDescriptor", "ExternalShuffleServiceFactory", "WorkerAddress"]
