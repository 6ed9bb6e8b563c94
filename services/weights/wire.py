"""Download chunks --> protobuf wire bytes, encoded by hand so a 4 MiB payload is copied once, not three times.

`DownloadChunk` is the one message whose size matters: building it through the protobuf API copies the
payload into the message, then into the serialised string. Here the small fields are encoded with the
protobuf API and the payload is appended once (`encode_chunk`); the gRPC method is registered with a
serializer that passes bytes through (`register`). The result parses as an ordinary `DownloadChunk`.
"""

from __future__ import annotations

from typing import Any

import grpc

from shared.proto.apprentice.v1 import weights_pb2, weights_pb2_grpc

SERVICE_NAME = "apprentice.v1.Weights"
_DATA_TAG = bytes([(3 << 3) | 2])  # field 3 (data), wire type 2 (length-delimited)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def encode_chunk(data: bytes | memoryview, *, path: str, offset: int, file_size: int, file_sha256: str,
                 manifest: weights_pb2.Manifest | None = None) -> bytes:
    """The wire form of DownloadChunk(path, offset, data, file_size, file_sha256, manifest)."""
    head = weights_pb2.DownloadChunk(path=path, offset=offset, file_size=file_size, file_sha256=file_sha256)
    if manifest is not None:
        head.manifest.CopyFrom(manifest)
    if not len(data):
        return head.SerializeToString()
    return b"".join((head.SerializeToString(), _DATA_TAG, _varint(len(data)), data))


def _passthrough(x: bytes | Any) -> bytes:
    return x if isinstance(x, bytes) else x.SerializeToString()


class _Capture:
    """Stands in for a server to collect the generated method handlers."""

    handlers: dict[str, grpc.RpcMethodHandler]

    def add_generic_rpc_handlers(self, _handlers: Any) -> None:
        pass

    def add_registered_method_handlers(self, _name: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.handlers = dict(handlers)


def register(servicer: weights_pb2_grpc.WeightsServicer, server: grpc.Server) -> None:
    """`add_WeightsServicer_to_server`, except that Download's responses may be pre-encoded bytes."""
    cap = _Capture()
    weights_pb2_grpc.add_WeightsServicer_to_server(servicer, cap)
    handlers = cap.handlers
    handlers["Download"] = grpc.unary_stream_rpc_method_handler(
        servicer.Download, request_deserializer=weights_pb2.DownloadRequest.FromString,
        response_serializer=_passthrough)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)
