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
