"""The external service's generated wire code, published: its protobuf messages (``pb``) and its
gRPC stubs and servicers (``pb_grpc``), made from proto/pyshuffle/v1/external_shuffle.proto by
scripts/generate_proto.py. Everything that speaks the wire, tests included, imports them here."""

from external_shuffle.wire._proto import external_shuffle_pb2 as pb
from external_shuffle.wire._proto import external_shuffle_pb2_grpc as pb_grpc

__all__ = ["pb", "pb_grpc"]
