"""The external gRPC shuffle service: a daemon (coordinator + workers, ``pyshuffle daemon``)
whose partitions outlive the processes that wrote them, and the client side (factory, master,
environment) selected with
``shuffle-service-factory.class = external_shuffle.ExternalShuffleServiceFactory``."""

from external_shuffle.client.descriptor import ExternalShuffleDescriptor
from external_shuffle.client.factory import ExternalShuffleServiceFactory
from external_shuffle.wire.messages import WorkerAddress

__all__ = ["ExternalShuffleDescriptor", "ExternalShuffleServiceFactory", "WorkerAddress"]
