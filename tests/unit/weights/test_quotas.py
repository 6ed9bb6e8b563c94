"""Upload quotas: per upload, per credential (count and bytes) and per server; released however a call ends."""

from __future__ import annotations

import pytest

from services.weights.quotas import UploadLimits, UploadQuotas
from shared.grpc_util import ResourceExhausted


@pytest.fixture
def quotas() -> UploadQuotas:
    return UploadQuotas(UploadLimits(max_upload_bytes=100, max_uploads_per_identity=2, max_bytes_per_identity=150,
                                     max_bytes_total=250))


def test_per_upload_limit(quotas: UploadQuotas) -> None:
    with pytest.raises(ResourceExhausted, match="more than the limit .* per upload"):
        with quotas.reserve("trainer", 101):
            pass
    assert quotas.in_flight("trainer") == (0, 0)


def test_concurrent_uploads_per_identity(quotas: UploadQuotas) -> None:
    with quotas.reserve("a", 10), quotas.reserve("a", 10):
        assert quotas.in_flight("a") == (2, 20)
        with pytest.raises(ResourceExhausted, match="'a' already has 2 uploads in flight"):
            with quotas.reserve("a", 1):
                pass
        with quotas.reserve("b", 10):  # another credential is not starved
            assert quotas.in_flight("b") == (1, 10)
    assert quotas.in_flight("a") == (0, 0) and quotas.total_bytes == 0
    with quotas.reserve("a", 10):  # capacity came back
        pass


def test_bytes_per_identity_and_total(quotas: UploadQuotas) -> None:
    with quotas.reserve("a", 100):
        with pytest.raises(ResourceExhausted, match="limit of .* per credential"):
            with quotas.reserve("a", 60):
                pass
        with quotas.reserve("b", 100):
            with pytest.raises(ResourceExhausted, match="server has .* in flight"):
                with quotas.reserve("c", 60):
                    pass
            assert quotas.total_bytes == 200


def test_released_when_the_call_fails(quotas: UploadQuotas) -> None:
    with pytest.raises(RuntimeError):
        with quotas.reserve("a", 100):
            raise RuntimeError("client hung up")
    assert quotas.in_flight("a") == (0, 0) and quotas.total_bytes == 0
