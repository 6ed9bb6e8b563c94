"""FeedbackRequest + caller --> admitted, or refused before it reaches Kafka.

Feedback becomes reward and knowledge, so the edge refuses what must never train anything:
- another tenant's interaction: interaction ids carry a MAC over (id, tenant)
  (shared/security/interaction_ids.py), so ownership is checked without a lookup (PERMISSION_DENIED);
- feedback dated before the interaction it rates, or too far in the future (INVALID_ARGUMENT);
- floods on one interaction: per-interaction caps on the number of events and their bytes
  (RESOURCE_EXHAUSTED). The counts are this pod's (a bounded LRU); the grader enforces the same caps
  over all pods, so a caller spreading a flood across pods still cannot grow its state.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from shared.rpc.grpc_util import InvalidRequest, PermissionDenied, ResourceExhausted
from shared.security import interaction_ids


@dataclass(frozen=True)
class FeedbackLimits:
    max_per_interaction: int
    max_bytes_per_interaction: int
    max_comment_chars: int
    clock_skew_s: float


class FeedbackGuard:
    def __init__(self, limits: FeedbackLimits, id_key: bytes, *, tracked: int = 100_000) -> None:
        self.limits = limits
        self.id_key = id_key
        self._tracked = tracked
        self._usage: OrderedDict[str, tuple[int, int]] = OrderedDict()   # interaction id -> (events, bytes)
        self._lock = threading.Lock()

    def check_owner(self, interaction_id: str, tenant: str) -> None:
        """PERMISSION_DENIED unless the id was issued to `tenant` (checked only when ids are signed)."""
        if self.id_key and not interaction_ids.verify(interaction_id, tenant, self.id_key):
            raise PermissionDenied(f"interaction {interaction_id[:80]!r} was not issued to tenant {tenant!r}")

    def check_time(self, interaction_id: str, occurred_at: datetime, now: datetime | None = None) -> None:
        """`occurred_at` within the skew of the interaction's time (from a signed id) and of now."""
        now = now or datetime.now(UTC)
        skew = timedelta(seconds=self.limits.clock_skew_s)
        if occurred_at > now + skew:
            raise InvalidRequest(f"occurred_at {occurred_at.isoformat()} is more than {skew.total_seconds():.0f}s "
                                 f"in the future")
        issued = interaction_ids.issued_at(interaction_id) if self.id_key else None
        if issued is not None and occurred_at < issued - skew:
            raise InvalidRequest(f"occurred_at {occurred_at.isoformat()} is before the interaction happened "
                                 f"({issued.isoformat()})")

    def admit(self, interaction_id: str, comment: str) -> None:
        """Count one event against the interaction's caps; RESOURCE_EXHAUSTED past them."""
        lim = self.limits
        if len(comment) > lim.max_comment_chars:
            raise InvalidRequest(f"comment must be at most {lim.max_comment_chars} characters; got {len(comment)}")
        size = len(comment.encode())
        with self._lock:
            events, total = self._usage.pop(interaction_id, (0, 0))
            if events + 1 > lim.max_per_interaction:
                self._usage[interaction_id] = (events, total)
                raise ResourceExhausted(f"interaction {interaction_id[:80]!r} already has {events} feedback events "
                                        f"(at most {lim.max_per_interaction})")
            if total + size > lim.max_bytes_per_interaction:
                self._usage[interaction_id] = (events, total)
                raise ResourceExhausted(f"feedback on interaction {interaction_id[:80]!r} would exceed "
                                        f"{lim.max_bytes_per_interaction} bytes of comments")
            self._usage[interaction_id] = (events + 1, total + size)
            while len(self._usage) > self._tracked:
                self._usage.popitem(last=False)
