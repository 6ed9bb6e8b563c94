"""Upload headers + the caller's identity --> a reservation of upload capacity, or RESOURCE_EXHAUSTED.

An Upload declares its total size before sending a byte, and its bytes land in temp files until the call
ends. Without limits one caller could hold the disk and every server thread with a few large, slow
uploads. A reservation is taken after the header is validated and released when the call ends, however
it ends; the limits are per upload, per identity (concurrent uploads, declared bytes in flight) and for
the whole server (declared bytes in flight), so one credential cannot starve the others.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from shared.rpc.grpc_util import ResourceExhausted


@dataclass(frozen=True)
class UploadLimits:
    max_upload_bytes: int
    """Declared bytes of one upload."""
    max_uploads_per_identity: int
    """Uploads in flight at once for one credential (key id)."""
    max_bytes_per_identity: int
    """Declared bytes in flight at once for one credential."""
    max_bytes_total: int
    """Declared bytes in flight at once on this server, every caller together."""


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB ({n} bytes)"


class UploadQuotas:
    """Thread-safe ledger of uploads in flight, by credential."""

    def __init__(self, limits: UploadLimits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._uploads: dict[str, int] = {}
        self._bytes: dict[str, int] = {}
        self._total = 0

    def in_flight(self, who: str) -> tuple[int, int]:
        """(uploads, declared bytes) in flight for credential `who`."""
        with self._lock:
            return self._uploads.get(who, 0), self._bytes.get(who, 0)

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return self._total

    @contextmanager
    def reserve(self, who: str, declared_bytes: int) -> Iterator[None]:
        """Hold capacity for one upload of `declared_bytes` by credential `who` for the block's duration;
        raise ResourceExhausted (nothing held) when a limit would be exceeded."""
        lim = self.limits
        with self._lock:
            uploads, held = self._uploads.get(who, 0), self._bytes.get(who, 0)
            if declared_bytes > lim.max_upload_bytes:
                raise ResourceExhausted(f"upload declares {_gib(declared_bytes)}, more than the limit of "
                                        f"{_gib(lim.max_upload_bytes)} per upload (APPRENTICE_WEIGHTS_MAX_UPLOAD_BYTES)")
            if uploads >= lim.max_uploads_per_identity:
                raise ResourceExhausted(f"{who!r} already has {uploads} uploads in flight, the limit per credential "
                                        "(APPRENTICE_WEIGHTS_MAX_UPLOADS_PER_IDENTITY); retry when one finishes")
            if held + declared_bytes > lim.max_bytes_per_identity:
                raise ResourceExhausted(f"{who!r} has {_gib(held)} of uploads in flight; this one ({_gib(declared_bytes)}) "
                                        f"would pass the limit of {_gib(lim.max_bytes_per_identity)} per credential "
                                        "(APPRENTICE_WEIGHTS_MAX_UPLOAD_BYTES_PER_IDENTITY); retry later")
            if self._total + declared_bytes > lim.max_bytes_total:
                raise ResourceExhausted(f"the server has {_gib(self._total)} of uploads in flight; this one "
                                        f"({_gib(declared_bytes)}) would pass the limit of {_gib(lim.max_bytes_total)} "
                                        "(APPRENTICE_WEIGHTS_MAX_UPLOAD_BYTES_IN_FLIGHT); retry later")
            self._uploads[who] = uploads + 1
            self._bytes[who] = held + declared_bytes
            self._total += declared_bytes
        try:
            yield
        finally:
            with self._lock:
                self._total -= declared_bytes
                self._bytes[who] -= declared_bytes
                self._uploads[who] -= 1
                if not self._uploads[who]:
                    del self._uploads[who], self._bytes[who]
