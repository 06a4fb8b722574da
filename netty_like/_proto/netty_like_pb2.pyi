from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class NettyShuffleDescriptorDetails(_message.Message):
    __slots__ = ("producer_location", "host", "data_port", "connection_index", "store_url", "on_shared_store")
    PRODUCER_LOCATION_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    DATA_PORT_FIELD_NUMBER: _ClassVar[int]
    CONNECTION_INDEX_FIELD_NUMBER: _ClassVar[int]
    STORE_URL_FIELD_NUMBER: _ClassVar[int]
    ON_SHARED_STORE_FIELD_NUMBER: _ClassVar[int]
    producer_location: str
    host: str
    data_port: int
    connection_index: int
    store_url: str
    on_shared_store: bool
    def __init__(self, producer_location: _Optional[str] = ..., host: _Optional[str] = ..., data_port: _Optional[int] = ..., connection_index: _Optional[int] = ..., store_url: _Optional[str] = ..., on_shared_store: _Optional[bool] = ...) -> None: ...
