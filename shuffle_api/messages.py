"""The contract's generated protobuf messages (``pb``): the versioned envelope that every
descriptor is serialized in, made from proto/pyshuffle/v1/descriptors.proto by
scripts/generate_proto.py. Published for what reads or builds envelopes besides
:mod:`shuffle_api.serialization`: other languages' readers are generated from the same .proto."""

from shuffle_api._proto import descriptors_pb2 as pb

__all__ = ["pb"]
