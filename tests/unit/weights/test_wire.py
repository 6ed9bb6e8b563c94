"""Hand-encoded Download chunks parse as the protobuf message they stand for."""

from __future__ import annotations

import pytest

from services.weights.wire import encode_chunk
from shared.proto.apprentice.v1 import weights_pb2


@pytest.mark.parametrize("size", [0, 1, 127, 128, 300, 16384, (4 << 20) + 3])
def test_encoded_chunk_round_trips(size: int) -> None:
    data = bytes(i % 251 for i in range(size))
    manifest = weights_pb2.Manifest(model="m", version="v3", kind="full",
                                    files=[weights_pb2.FileEntry(path="a", size=size, sha256="ab" * 32)])
    for man in (manifest, None):
        raw = encode_chunk(memoryview(data), path="model.safetensors", offset=2**40 + 5, file_size=size + 9,
                           file_sha256="cd" * 32, manifest=man)
        want = weights_pb2.DownloadChunk(path="model.safetensors", offset=2**40 + 5, data=data, file_size=size + 9,
                                         file_sha256="cd" * 32)
        if man is not None:
            want.manifest.CopyFrom(man)
        assert weights_pb2.DownloadChunk.FromString(raw) == want


@pytest.mark.parametrize("size", [0, 1, 300, (1 << 20) + 7])
def test_client_decoder_reads_what_the_server_encodes(size: int) -> None:
    """`weights_wire.decode_chunk` (the pods' fast path) agrees with the protobuf parser field by field."""
    from shared.weights.wire import decode_chunk

    data = bytes(i % 251 for i in range(size))
    manifest = weights_pb2.Manifest(model="m", version="v3", kind="lora", base_version="v1",
                                    files=[weights_pb2.FileEntry(path="a/b", size=size, sha256="ab" * 32)])
    for man in (manifest, None):
        raw = encode_chunk(data, path="sub/é.bin", offset=2**40 + 5, file_size=size + 9, file_sha256="cd" * 32,
                           manifest=man)
        got, want = decode_chunk(raw), weights_pb2.DownloadChunk.FromString(raw)
        assert (got.path, got.offset, bytes(got.data), got.file_size, got.file_sha256) == \
            (want.path, want.offset, want.data, want.file_size, want.file_sha256)
        assert got.HasField("manifest") == want.HasField("manifest")
        assert (got.manifest == man) if man is not None else got.manifest is None


def test_client_decoder_skips_unknown_fields_and_rejects_garbage() -> None:
    """A newer server may add fields (skipped, as protobuf does); truncated bytes must not pass as data."""
    from shared.weights.wire import decode_chunk

    raw = weights_pb2.DownloadChunk(path="p", offset=7, data=b"xyz").SerializeToString()
    from services.weights.wire import _varint

    unknown = (_varint(20 << 3 | 0) + _varint(150) + _varint(21 << 3 | 2) + b"\x02ab"
               + _varint(22 << 3 | 5) + bytes(4) + _varint(23 << 3 | 1) + bytes(8))
    got = decode_chunk(unknown + raw)
    assert (got.path, got.offset, bytes(got.data)) == ("p", 7, b"xyz")
    for bad in (raw[:-1], raw + bytes([(3 << 3) | 2, 50]), bytes([(3 << 3) | 3]), b"\xff" * 11):
        with pytest.raises(ValueError, match="malformed"):
            decode_chunk(bad)
