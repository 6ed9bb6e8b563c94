"""The tenants' approved knowledge --> the few relevant items in each chat request's context.

Learn in seconds: an item an operator approves serves in the very next request that needs it, long before
any training round has put it into the weights. It leaves the context once a promoted version answers its
questions without it (the extractor then marks it CONSOLIDATED) and comes back if a later version loses it.

- `ServedKnowledge` holds the latest snapshot of every knowledge base (key "tenant/domain") and, per base,
  the servable items: APPROVED and PINNED. PROPOSED (unreviewed), REJECTED, RETIRED and CONSOLIDATED items
  never reach a prompt. A snapshot whose key names another tenant than its envelope is refused, so one
  tenant can never place items in another's prompts, and retrieval only ever reads the request's own
  tenant's bases.
- `augment` picks the items relevant to the request's last user turn (shared/knowledge/retrieval.py), within
  the tenant's token budget, and hands their texts to the request's one prompt (services/inference/prompt.py
  `ServedPrompt.with_notes`), which puts them inside the injection-safe frame (shared/knowledge/frame.py) that
  the trainer's teacher also uses, next to the tools, tool calls and results and whatever redaction the prompt
  already holds. The recorded `messages` stay without the frame; the prompt text and token ids (what the model
  saw, and what the trainer's log-probs are computed on) hold it; `knowledge` records which items (ids,
  revisions, base version) were there. Raw prompts are left alone: there is no system turn to put the frame in
  without changing what the caller wrote.
- `follow_knowledge` feeds it from the compacted knowledge topic (shared/knowledge/follow.py).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from services.inference import metrics
from services.inference.requests import PreparedRequest
from services.inference.settings import InferenceSettings
from shared.kafka.deadletter import DeadLetterPublisher
from shared.kafka.trust import RecordTrust, UntrustedRecord
from shared.knowledge.embeddings import EmbeddingsUnavailable, MiniLMEmbedder
from shared.knowledge.follow import SnapshotFollower, belongs_to_its_tenant
from shared.knowledge.retrieval import Entry, Retriever
from shared.proto.apprentice.v1 import events_pb2

log = logging.getLogger(__name__)

SERVED = (events_pb2.ITEM_STATUS_APPROVED, events_pb2.ITEM_STATUS_PINNED)
DEFAULT_DOMAIN = "general"


def make_retriever(settings: InferenceSettings) -> Retriever:
    """The configured retriever; `minilm` falls back to TF-IDF when the embedding package is missing."""
    if settings.knowledge.retriever == "minilm":
        try:
            return Retriever(MiniLMEmbedder(), min_score=settings.knowledge.min_score,
                             margin=settings.knowledge.margin)
        except EmbeddingsUnavailable as e:
            log.warning("knowledge retrieval falls back to TF-IDF: %s", e)
    return Retriever(None, margin=settings.knowledge.margin)


def servable_entries(snap: events_pb2.KnowledgeSnapshot) -> list[Entry]:
    """The items of a snapshot that may enter a prompt."""
    return [Entry(key=snap.key, item_id=it.item_id, revision=it.revision, snapshot_version=snap.version,
                  text=it.text, questions=tuple(it.questions), tokens=it.token_count)
            for it in snap.items if it.status in SERVED and it.text.strip()]


class ServedKnowledge:
    """Latest snapshot per base --> the servable items per tenant (see the module docstring)."""

    def __init__(self, settings: InferenceSettings, retriever: Retriever | None = None) -> None:
        self.settings = settings
        self.retriever = retriever if retriever is not None else make_retriever(settings)
        self._lock = threading.Lock()
        self._versions: dict[str, int] = {}
        self._entries: dict[str, list[Entry]] = {}           # key -> servable entries
        self.refused_other_tenant = 0

    def apply(self, snap: events_pb2.KnowledgeSnapshot) -> bool:
        """Adopt a snapshot when it is the newest of its base; False when refused or stale."""
        if not belongs_to_its_tenant(snap):
            self.refused_other_tenant += 1
            return False
        entries = servable_entries(snap)
        with self._lock:
            if snap.version <= self._versions.get(snap.key, 0):
                return False
        self.retriever.warm(entries)                        # embed outside the lock
        with self._lock:
            if snap.version <= self._versions.get(snap.key, 0):
                return False
            self._versions[snap.key] = snap.version
            self._entries[snap.key] = entries
            total = sum(len(v) for v in self._entries.values())
        metrics.KNOWLEDGE_ITEMS.set(total)
        return True

    def forget(self, key: str) -> None:
        """A tombstone: the base is gone."""
        with self._lock:
            self._versions.pop(key, None)
            self._entries.pop(key, None)

    def entries(self, tenant: str, task: str) -> list[Entry]:
        """The servable items of the tenant's base for this task (domain = task, "general" if empty)."""
        with self._lock:
            return list(self._entries.get(f"{tenant}/{task or DEFAULT_DOMAIN}", ()))

    def augment(self, p: PreparedRequest, tokenizer: Any, context_window: int) -> None:
        """Put the relevant items in `p`'s prompt (in place); leaves `p` unchanged when the tenant's switch is
        off, the request opted out, it is a raw prompt, nothing is relevant, or nothing fits."""
        if p.raw_prompt or p.no_knowledge or not self.settings.knowledge_on_for(p.tenant):
            return
        entries = self.entries(p.tenant, p.task)
        users = [m.content for m in p.messages if m.role == "user"]
        if not entries or not users:
            return
        chosen = self.retriever.select(users[-1], entries, max_items=self.settings.knowledge.max_items,
                                       max_tokens=self.settings.knowledge_budget_for(p.tenant))
        if not chosen:
            return
        while chosen:
            served = p.prompt.with_notes(tokenizer, [e.text for e, _ in chosen])
            if len(served.ids) + p.sampling.max_new_tokens <= context_window:
                p.prompt = served
                p.knowledge = [events_pb2.KnowledgeRef(key=e.key, item_id=e.item_id, revision=e.revision,
                                                       snapshot_version=e.snapshot_version, score=s)
                               for e, s in chosen]
                metrics.KNOWLEDGE_IN_CONTEXT.labels(outcome="added").inc()
                return
            chosen = chosen[:-1]          # the least relevant goes first until the prompt fits
        metrics.KNOWLEDGE_IN_CONTEXT.labels(outcome="no_room").inc()


def follow_knowledge(settings: InferenceSettings, served: ServedKnowledge,
                     dead: DeadLetterPublisher | None = None) -> SnapshotFollower:
    """A started reader of the knowledge topic into `served` (a private consumer group per pod: every pod
    needs every base). Only the extractor's snapshots are served, an old one replayed after a newer one of
    its key is not (shared/kafka/trust.py, monotonic); a refused record goes to `dead` with its reason
    (stage "inference.knowledge")."""
    topics = settings.common.topics

    def refused(msg: Any, err: UntrustedRecord) -> None:
        if dead is not None:
            dead.publish(msg, stage="inference.knowledge", reason=str(err), error_type=type(err).__name__)

    return SnapshotFollower(settings.common.kafka_bootstrap, topics.knowledge,
                            topics.group_id(f"inference-knowledge-{settings.pod_id}"),
                            on_snapshot=served.apply, on_tombstone=served.forget,
                            trust=lambda: RecordTrust.from_settings(settings.common, monotonic=True),
                            on_refused=refused).start()
