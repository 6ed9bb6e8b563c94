"""Upload quotas: per upload, per credential (count and bytes) and per server; released however a call ends."""

from __future__ import annotations

import pytest

from services.weights.quotas import UploadLimits, UploadQuotas
from shared.rpc.grpc_util import ResourceExhausted


@pytest.fixture
def quotas() -> UploadQuotas:
    return UploadQuotas(UploadLimits(max_upload_bytes=100, max_uploads_per_identity=2, max_bytes_per_identity=150,
                                     max_bytes_total=250))


def refusal(quotas: UploadQuotas, who: str, declared: int) -> str:
    """The RESOURCE_EXHAUSTED message of a reservation that must be refused (and hold nothing)."""
    before = quotas.in_flight(who), quotas.total_bytes
    with pytest.raises(ResourceExhausted) as e, quotas.reserve(who, declared):
        pass
    assert (quotas.in_flight(who), quotas.total_bytes) == before
    return str(e.value)


def test_per_upload_limit(quotas: UploadQuotas) -> None:
    assert "more than the limit of 0.00 GiB (100 bytes) per upload" in refusal(quotas, "trainer", 101)


def test_concurrent_uploads_per_identity(quotas: UploadQuotas) -> None:
    with quotas.reserve("a", 10), quotas.reserve("a", 10):
        assert quotas.in_flight("a") == (2, 20)
        assert "'a' already has 2 uploads in flight" in refusal(quotas, "a", 1)
        with quotas.reserve("b", 10):  # another credential is not starved
            assert quotas.in_flight("b") == (1, 10)
    assert quotas.in_flight("a") == (0, 0) and quotas.total_bytes == 0
    with quotas.reserve("a", 10):  # capacity came back
        assert quotas.in_flight("a") == (1, 10)


def test_bytes_per_identity_and_total(quotas: UploadQuotas) -> None:
    with quotas.reserve("a", 100):
        assert "per credential" in refusal(quotas, "a", 60)
        with quotas.reserve("b", 100):
            assert "the server has 0.00 GiB (200 bytes) of uploads in flight" in refusal(quotas, "c", 60)
            assert quotas.total_bytes == 200


def test_released_when_the_call_fails(quotas: UploadQuotas) -> None:
    with pytest.raises(RuntimeError), quotas.reserve("a", 100):
        raise RuntimeError("client hung up")
    assert quotas.in_flight("a") == (0, 0) and quotas.total_bytes == 0
