"""Stored responses: what `previous_response_id` continues from and `GET /v1/responses/{id}` returns.

One pod keeps the responses it served, in memory, bounded by count, characters and age (least recently
used first out). A response is found only by a caller of the tenant it was served to: a lookup from
another tenant is the same "not found" as an id that never existed, so an id reveals nothing across
tenants (ids are unguessable anyway: they hold the interaction id, which carries a MAC).

Behind several pods a chain of responses needs the pods to agree on where a conversation lives: route
by the `x-apprentice-session-id` header or the previous response id (sticky sessions), or send the whole
history as input items, which any pod serves (what the OpenAI Agents SDK does unless told otherwise).
docs/agents.md says so.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from shared.rpc.grpc_util import NotFound

DEFAULT_MAX_RESPONSES = 10_000
DEFAULT_MAX_CHARS = 64 * 1024 * 1024
"""The stored histories' and bodies' JSON text, summed: the store's memory bound (about this many bytes)."""
DEFAULT_TTL_S = 6 * 3600.0


class PreviousResponseNotFound(NotFound):
    """HTTP 404, code `previous_response_not_found` (OpenAI's), param previous_response_id."""

    param = "previous_response_id"
    error_code = "previous_response_not_found"


@dataclass
class StoredResponse:
    tenant: str
    session_id: str
    history: list[dict[str, Any]]
    """The conversation as chat messages, this response's answer included, without the instructions."""
    body: dict[str, Any]
    stored_at: float = field(default_factory=time.monotonic)

    @property
    def chars(self) -> int:
        return len(json.dumps(self.history)) + len(json.dumps(self.body))


class ResponseStore:
    """Thread-safe LRU of stored responses (the HTTP handlers run on worker threads)."""

    def __init__(self, max_responses: int = DEFAULT_MAX_RESPONSES, max_chars: int = DEFAULT_MAX_CHARS,
                 ttl_s: float = DEFAULT_TTL_S) -> None:
        self.max_responses, self.max_chars, self.ttl_s = max_responses, max_chars, ttl_s
        self._items: OrderedDict[str, tuple[StoredResponse, int]] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, response_id: str, item: StoredResponse) -> None:
        size = item.chars
        if size > self.max_chars:
            return                          # larger than the whole store: not kept (a later chain 404s)
        with self._lock:
            self._drop(response_id)
            self._items[response_id] = (item, size)
            self._chars += size
            while len(self._items) > self.max_responses or self._chars > self.max_chars:
                self._drop(next(iter(self._items)))

    def get(self, response_id: str, tenant: str) -> StoredResponse:
        """The response `response_id` served to `tenant`; PreviousResponseNotFound otherwise (also for
        an expired one, and for another tenant's)."""
        with self._lock:
            found = self._items.get(response_id)
            if found is not None and time.monotonic() - found[0].stored_at > self.ttl_s:
                self._drop(response_id)
                found = None
            if found is None or found[0].tenant != tenant:
                raise PreviousResponseNotFound(f"response {response_id[:80]!r} not found (responses are kept "
                                               "by the pod that served them, for a limited time)")
            self._items.move_to_end(response_id)
            return found[0]

    def delete(self, response_id: str, tenant: str) -> None:
        self.get(response_id, tenant)
        with self._lock:
            self._drop(response_id)

    def _drop(self, response_id: str) -> None:
        old = self._items.pop(response_id, None)
        if old is not None:
            self._chars -= old[1]
