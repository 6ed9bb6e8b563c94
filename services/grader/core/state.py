"""One interaction's join state <--> bytes for the changelog-backed table (pure, no Kafka).

The table maps interaction id -> `PendingState`: the interaction (raw protobuf bytes, as received), the
feedback joined so far, judge results, the event ids already applied (idempotency), the last emitted
revision and its digest, the window deadline, and the *emission marker* (`pending_seq`) that recovery
uses to tell "emitted just before a crash" from "never emitted" (see services/grader/stream/recovery.py).

Encoding: b"GS1" + u32 header length + JSON header + length-prefixed blobs (interaction, then each
feedback). Protobuf bytes travel untouched, so a state costs about one interaction record.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field, fields, replace
from typing import Any

MAGIC = b"GS1"
_U32 = struct.Struct(">I")
_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))
MAX_SEEN = 256
"""Event ids remembered per interaction. Each event applies once per interaction, and an interaction
receives a handful of events, so this bounds memory without ever forgetting in practice."""


@dataclass
class PendingState:
    interaction_id: str
    partition: int = -1
    """Table partition (= join-topic partition) that owns this key."""
    interaction: bytes | None = None
    """The `Interaction` record as received; None while only feedback has arrived."""
    feedback: list[bytes] = field(default_factory=list)
    """`FeedbackEvent` records in arrival order, duplicates removed."""
    judge: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Judge grader name -> {"value", "has_signal", "detail"} from the judge stage."""
    seen: list[str] = field(default_factory=list)
    """Event ids already applied (interaction, feedback, judge results)."""
    revision: int = 0
    """Last emitted revision (0 = nothing emitted yet)."""
    digest: str = ""
    """Digest of the last emitted content: a revision is emitted only when the content changes."""
    deadline: float = 0.0
    """Epoch seconds when the feedback window ends (interaction occurred_at + window)."""
    first_seen: float = 0.0
    """Epoch seconds of the first event for this key (orphan-feedback expiry)."""
    emitted_at: float = 0.0
    closed: bool = False
    """The window is over (expired or feedback complete): later feedback produces revisions."""
    stats_counted: bool = False
    """This interaction has been fed to the detectors' rolling statistics (once per interaction)."""
    pending_seq: int = 0
    """Batch sequence of the last emission. Confirmed when <= the partition's confirmed sequence."""
    pending_ts: float = 0.0
    """Wall clock just before the last emission was sent (where recovery starts looking)."""
    tenant: str = ""
    task: str = ""
    """The interaction's tenant and task (the pending summary; set when the interaction arrives)."""
    window: float = -1.0
    """The feedback window `deadline` was computed with; a rule that changes the task's window moves the
    deadline by the difference (join.py). -1: unknown (a state written before this field existed)."""

    # --- idempotency -----------------------------------------------------------------------------
    def has_seen(self, event_id: str) -> bool:
        return event_id in self.seen

    def mark_seen(self, event_id: str) -> None:
        self.seen.append(event_id)
        if len(self.seen) > MAX_SEEN:
            del self.seen[: len(self.seen) - MAX_SEEN]

    def copy(self) -> PendingState:
        """An independent copy (a failed `Joiner.apply` may leave its argument half changed)."""
        return replace(self, feedback=list(self.feedback), seen=list(self.seen),
                       judge={k: dict(v) for k, v in self.judge.items()})

    # --- codec -----------------------------------------------------------------------------------
    def encode(self) -> bytes:
        header = {f: getattr(self, f) for f in _HEADER_FIELDS}
        header["has_interaction"] = self.interaction is not None
        header["n_feedback"] = len(self.feedback)
        h = _COMPACT_JSON.encode(header).encode()
        parts = [MAGIC, _U32.pack(len(h)), h]
        for blob in ([self.interaction] if self.interaction is not None else []) + self.feedback:
            parts += [_U32.pack(len(blob)), blob]
        return b"".join(parts)

    @classmethod
    def decode(cls, data: bytes) -> PendingState:
        if not data.startswith(MAGIC):
            raise ValueError("not a grader state record (bad magic)")
        pos = len(MAGIC)

        def take() -> bytes:
            nonlocal pos
            (n,) = _U32.unpack_from(data, pos)
            pos += _U32.size
            if pos + n > len(data):
                raise ValueError("truncated grader state record")
            out = data[pos:pos + n]
            pos += n
            return out

        header = json.loads(take())
        has_interaction = header.pop("has_interaction")
        n_feedback = header.pop("n_feedback")
        state = cls(**header)
        state.interaction = take() if has_interaction else None
        state.feedback = [take() for _ in range(n_feedback)]
        return state


_HEADER_FIELDS = tuple(f.name for f in fields(PendingState) if f.name not in ("interaction", "feedback"))

SEQ_KEY_PREFIX = "__confirmed__/"


def seq_key(partition: int) -> str:
    """Table key holding partition `partition`'s confirmed emission sequence (see services/grader/stream/recovery.py)."""
    return f"{SEQ_KEY_PREFIX}{partition}"


def encode_seq(seq: int) -> bytes:
    return json.dumps({"confirmed_seq": seq}).encode()


def decode_seq(data: bytes | None) -> int:
    return int(json.loads(data)["confirmed_seq"]) if data else 0
