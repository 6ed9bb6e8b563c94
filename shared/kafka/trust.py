"""Settings --> the record signer a service produces with, and the check every consumer applies before
decoding a record (who wrote it, may they write this topic, is it a replay).

Signing and checking themselves are in shared/kafka/signing.py; this module is the wiring every service
shares, so that a consumer refuses an untrusted record the same way it refuses an undecodable one: with
`UntrustedRecord`, an `UndecodableEvent`, which every consumer already dead-letters with its reason.

Three refusals beyond the signature itself (SECURITY.md section 4):

- a record signed by a principal the topic table (shared/contracts/topic_access.py) does not let write
  that topic ("signer trainer may not write apprentice.graded.v1");
- a replay: a signature already accepted at another (topic, partition, offset), within the verifier's
  memory;
- for state topics (`monotonic=True`: model updates, knowledge snapshots), a record signed more than
  `SKEW_MS` before the last one accepted for the same key: an old order re-sent after the memory forgot
  it (or after a restart) cannot roll the state back;
- a record signed more than `SKEW_MS` in the future (a producer clock that cannot be trusted).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TypeVar

from confluent_kafka import Message
from google.protobuf.message import Message as ProtoMessage
from prometheus_client import Counter

from shared.contracts.events import UndecodableEvent
from shared.contracts.topics import contract_name
from shared.contracts.validation import HeadersLike, decode_record
from shared.kafka.signing import KeyRing, RecordSigner, RecordVerifier, Verdict, load_signer
from shared.settings import CommonSettings

M = TypeVar("M", bound=ProtoMessage)

SKEW_MS = 5 * 60 * 1000
"""Clock difference tolerated between a producer and a consumer (signed in the future), and between two
records of one key on a state topic (signed before the record they follow)."""

REFUSED = Counter("apprentice_records_refused_total",
                  "Records a consumer refused for who wrote them (no or bad signature, a signer not allowed "
                  "on the topic, a replay)", ["topic", "reason"])


class UntrustedRecord(UndecodableEvent):
    """A record whose writer cannot be trusted for its topic. Recoverable: dead-letter it and go on."""


def record_signer(settings: CommonSettings, principal: str) -> RecordSigner | None:
    """The signer of `principal` (None when signatures are off). Raises SigningKeyMissing, naming the
    setting, when signatures are required and the principal's private key is not in the keys directory."""
    if settings.record_signatures == "off":
        return None
    return load_signer(settings.record_keys_path(), principal)


def _reason_kind(reason: str) -> str:
    # the metric's label: a bounded set, never a principal's or key's name
    for kind in ("unsigned", "replay", "may not write", "future", "older", "bad signature", "not ours"):
        if kind in reason:
            return kind.replace(" ", "_")
    return "other"


class RecordTrust:
    """One consumer's check of the records it reads. `check` raises UntrustedRecord; `decode` checks then
    decodes. With signatures off every record is accepted (and decoded as before)."""

    def __init__(self, verifier: RecordVerifier | None, *, monotonic: bool = False,
                 clock_ms: Callable[[], int] | None = None) -> None:
        self.verifier = verifier
        self.monotonic = monotonic
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self._latest: dict[tuple[str, bytes | None], int] = {}
        self.refused = 0

    @classmethod
    def from_settings(cls, settings: CommonSettings, *, monotonic: bool = False) -> RecordTrust:
        """The check configured by `settings` (public keys re-read from the keys directory: a consumer
        built after a rotation sees the new keys)."""
        if settings.record_signatures == "off":
            return cls(None, monotonic=monotonic)
        return cls(RecordVerifier(KeyRing.load(settings.record_keys_path())), monotonic=monotonic)

    def verdict(self, topic: str, key: bytes | str | None, value: bytes | None, headers: HeadersLike,
                *, partition: int | None = None, offset: int | None = None) -> Verdict:
        """The verdict on one record read from concrete topic `topic`, without raising."""
        if self.verifier is None:
            return Verdict(True)
        base = contract_name(topic)
        if base is None:
            return Verdict(False, f"{topic} is not an Apprentice topic (not ours)")
        pairs = headers.items() if isinstance(headers, Mapping) else (headers or ())
        hdrs: list[tuple[str, bytes | str | None]] = [(str(k), v) for k, v in pairs]
        where = (topic, partition, offset) if partition is not None and offset is not None else None
        verdict = self.verifier.check(base, key, value, hdrs, where=where)
        if not verdict.ok:
            return verdict
        now = self._clock_ms()
        if verdict.signed_at_ms > now + SKEW_MS:
            return Verdict(False, f"signed {(verdict.signed_at_ms - now) / 1000:.0f} s in the future",
                           verdict.principal)
        if self.monotonic:
            k = (base, key.encode() if isinstance(key, str) else key)
            last = self._latest.get(k)
            if last is not None and verdict.signed_at_ms < last - SKEW_MS:
                return Verdict(False, f"replay: signed {(last - verdict.signed_at_ms) / 1000:.0f} s older than "
                                      "the record it would replace", verdict.principal)
            self._latest[k] = max(last or 0, verdict.signed_at_ms)
        return verdict

    def check_record(self, topic: str, key: bytes | str | None, value: bytes | None, headers: HeadersLike,
                     *, partition: int | None = None, offset: int | None = None) -> None:
        """Raise UntrustedRecord ("untrusted record: <reason>") unless the record may be trusted."""
        verdict = self.verdict(topic, key, value, headers, partition=partition, offset=offset)
        if not verdict.ok:
            self.refused += 1
            REFUSED.labels(contract_name(topic) or "other", _reason_kind(verdict.reason)).inc()
            raise UntrustedRecord(f"untrusted record: {verdict.reason}")

    def check(self, msg: Message) -> None:
        """`check_record` for a confluent-kafka message."""
        self.check_record(msg.topic() or "", msg.key(), msg.value(), msg.headers(),
                          partition=msg.partition(), offset=msg.offset())

    def decode(self, msg_type: type[M], msg: Message) -> M:
        """Check who wrote `msg`, then decode and check its value (shared/contracts/validation.py)."""
        self.check(msg)
        return decode_record(msg_type, msg.value(), msg.headers())
