"""Signed producers for tests: records written by a test stand in for a service's, so they carry that
service's signature (shared/kafka/signing.py), from the keys the session's broker wrote
(`APPRENTICE_RECORD_KEYS_DIR`, set by tests/conftest.py)."""

from __future__ import annotations

from typing import Any

from shared.kafka.producer import EventProducer
from shared.kafka.signing import RecordSigner, load_signer
from shared.settings import CommonSettings


def signer(principal: str) -> RecordSigner:
    """`principal`'s record signer, from this environment's keys directory."""
    return load_signer(CommonSettings().record_keys_path(), principal)


def signed_producer(bootstrap: str, principal: str, **kwargs: Any) -> EventProducer:
    """An EventProducer whose records carry `principal`'s signature (as that service's would)."""
    kwargs.setdefault("client_id", f"test-as-{principal}")
    return EventProducer(bootstrap, signer=signer(principal), **kwargs)
