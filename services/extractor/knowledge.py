"""Extraction results and operator actions --> new versions of the per-tenant/domain knowledge bases.

Each change makes a `KnowledgeSnapshot` with version = previous + 1. A snapshot becomes the current state
only after `publish` returned, i.e. after it is durable on the compacted knowledge topic; if publishing
raises, nothing changed (the caller retries or reports). Restarting = `load`ing every snapshot read back
from that topic: the highest version per key wins, and its `processed` list says which graded
interaction revisions were already applied (idempotence on redelivery).

Review (knowledge is untrusted until reviewed): a new item is PROPOSED, and only an operator's Approve or
Pin lets it reach training. The one exception is a tenant that opted in to auto-approval
(`requires_approval(tenant)` false), and then only for an item whose every source is a trusted caller
(operator or service credential, `Source.trusted`) and whose text the injection screen did not flag.
Every item records its provenance (who, which interactions, when; every merge and review after) and its
screen flags; an edit that would introduce a flag is refused, and approving or pinning a flagged item
needs an explicit override.

Personal data keeps an item out (`Curator.rejection`), judged with the base's tenant's declared public
business data (`business_data(tenant)`, from `APPRENTICE_BUSINESS_NAMES` and `APPRENTICE_BUSINESS_DATA`): an
item naming the tenant's product or the staff member who decided, or giving its declared phone number or
e-mail address, is the business's knowledge, not a user's data.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from google.protobuf.timestamp_pb2 import Timestamp

from services.extractor.curation import ACTIVE, TRAINING, Curator, Verdict, item_id, normalise
from services.extractor.pii import names_from_user_texts
from services.extractor.trajectories import Source, Trajectory, split_key
from shared.contracts.events import deterministic_id, make_envelope
from shared.knowledge.terms import answer_terms
from shared.privacy.business import NO_DATA, BusinessData
from shared.privacy.injection_screen import InjectionScreen
from shared.proto.apprentice.v1 import common_pb2, events_pb2
from shared.rpc.grpc_util import FailedPrecondition, InvalidRequest, NotFound

S = events_pb2.ItemStatus
Publish = Callable[[events_pb2.KnowledgeSnapshot], None]


@dataclass
class Candidate:
    """A proposed item before curation."""

    text: str
    created_by: str                     # "llm:<model>@<policy version>" or "correction"
    sources: list[str] = field(default_factory=list)   # interaction ids (provenance)
    by: Source = Source()               # who caused it (the least trusted caller it derives from)
    detail: str = ""                    # provenance detail, e.g. the correction's feedback event id
    questions: list[str] = field(default_factory=list)   # what it answers (the user turns it came from)


@dataclass
class Extracted:
    """One trajectory's extraction, ready to be applied to its base."""

    trajectory: Trajectory
    candidates: list[Candidate]
    extractor_model: str = ""
    policy_version: str = ""


def _now() -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(datetime.now(UTC))
    return ts


_VERSION = re.compile(r"^(?:(?P<key>.+?)[@:])?v?(?P<n>\d+)$")


def parse_knowledge_version(ref: str, key: str) -> int | None:
    """`Interaction.knowledge_version` --> version number of `key`. Accepts "7", "v7", "acme/support@7",
    "acme/support@v7", "acme/support:7"; None when empty or naming another base."""
    m = _VERSION.match(ref.strip()) if ref else None
    if m is None or (m.group("key") and m.group("key") != key):
        return None
    return int(m.group("n"))


class KnowledgeStore:
    def __init__(self, curator: Curator, publish: Publish, *, requires_approval: Callable[[str], bool],
                 max_tokens: int = 1024, max_rejected_kept: int = 200, max_processed_kept: int = 2000,
                 history_per_key: int = 100, source: str = "extractor",
                 clock: Callable[[], Timestamp] = _now, screen: InjectionScreen | None = None,
                 max_provenance: int = 20, max_questions: int = 8,
                 business_data: Callable[[str], BusinessData] = lambda tenant: NO_DATA) -> None:
        self.curator = curator
        self.business_data = business_data
        self._publish = publish
        self.requires_approval = requires_approval
        self.max_tokens = max_tokens
        self.max_rejected_kept = max_rejected_kept
        self.max_processed_kept = max_processed_kept
        self.history_per_key = history_per_key
        self.source = source
        self._clock = clock
        self.screen = screen or InjectionScreen()
        self.max_provenance = max_provenance
        self.max_questions = max_questions
        self._lock = threading.RLock()
        self._history: dict[str, dict[int, events_pb2.KnowledgeSnapshot]] = {}
        self._latest: dict[str, events_pb2.KnowledgeSnapshot] = {}
        self._processed: dict[str, dict[str, int]] = {}

    # --- reading -------------------------------------------------------------------------------------
    def base_keys(self) -> list[str]:
        with self._lock:
            return sorted(self._latest)

    def latest(self, key: str) -> events_pb2.KnowledgeSnapshot | None:
        with self._lock:
            snap = self._latest.get(key)
            return _copy(snap) if snap is not None else None

    def get(self, key: str, version: int = 0) -> events_pb2.KnowledgeSnapshot:
        """The base at `version` (0 = latest); NotFound when unknown or no longer kept."""
        with self._lock:
            if key not in self._latest:
                # names only the key asked for: listing the others told any tenant every other tenant's bases
                raise NotFound(f"no knowledge base {key!r}")
            if version == 0:
                return _copy(self._latest[key])
            snap = self._history.get(key, {}).get(version)
            if snap is None:
                kept = sorted(self._history.get(key, {}))
                raise NotFound(f"{key!r} has no version {version} here (kept: {kept[:1]}..{kept[-1:]}, "
                               f"latest {self._latest[key].version})")
            return _copy(snap)

    def is_new(self, key: str, interaction_id: str, revision: int) -> bool:
        """True unless this revision (or a later one) of the interaction was already applied to `key`."""
        with self._lock:
            return revision > self._processed.get(key, {}).get(interaction_id, 0)

    def active_texts(self, key: str) -> list[str]:
        """The items an extractor should see as previous experience (proposed, approved, pinned), except
        flagged proposals: an unreviewed injection must not reach the extractor's prompt either."""
        with self._lock:
            snap = self._latest.get(key)
            if snap is None:
                return []
            return [it.text for it in snap.items if it.status in (*ACTIVE, S.ITEM_STATUS_PINNED)
                    and not (it.status == S.ITEM_STATUS_PROPOSED and it.screen_flags)]

    # --- restoring -------------------------------------------------------------------------------------
    def load(self, snap: events_pb2.KnowledgeSnapshot) -> bool:
        """Adopt a snapshot read back from the topic; the highest version per key wins."""
        with self._lock:
            self._remember(snap)
            cur = self._latest.get(snap.key)
            if cur is not None and cur.version >= snap.version:
                return False
            self._set_latest(snap)
            return True

    def _remember(self, snap: events_pb2.KnowledgeSnapshot) -> None:
        hist = self._history.setdefault(snap.key, {})
        hist[snap.version] = _copy(snap)
        while len(hist) > self.history_per_key:
            del hist[min(hist)]

    def _set_latest(self, snap: events_pb2.KnowledgeSnapshot) -> None:
        self._latest[snap.key] = _copy(snap)
        self._processed[snap.key] = {p.interaction_id: p.revision for p in snap.processed}

    def _commit(self, snap: events_pb2.KnowledgeSnapshot) -> events_pb2.KnowledgeSnapshot:
        """Publish durably, then make it current. Raises (state unchanged) if publishing fails."""
        self._publish(snap)
        self._remember(snap)
        self._set_latest(snap)
        return _copy(snap)

    # --- building a new version --------------------------------------------------------------------------
    def _next(self, key: str, change: str) -> events_pb2.KnowledgeSnapshot:
        tenant, domain = split_key(key)
        cur = self._latest.get(key)
        new = events_pb2.KnowledgeSnapshot()
        if cur is not None:
            new.CopyFrom(cur)
        new.key, new.domain = key, domain
        new.version = (cur.version if cur is not None else 0) + 1
        new.require_approval = self.requires_approval(tenant)
        new.change = change
        new.envelope.CopyFrom(make_envelope(tenant, source=self.source,
                                            event_id=deterministic_id("knowledge", key, str(new.version)),
                                            occurred_at=self._clock()))
        return new

    def apply(self, key: str, batch: Sequence[Extracted]) -> tuple[events_pb2.KnowledgeSnapshot | None, list[Verdict]]:
        """Apply extraction results to `key`: counters, new/merged items, processed refs, cap.
        Returns the new durable snapshot, or None when nothing changed."""
        with self._lock:
            snap = self._next(key, "")
            now = self._clock()
            items = snap.items
            verdicts: list[Verdict] = []
            changed = False
            added = merged = 0
            for ex in batch:
                traj = ex.trajectory
                new_turns = [t for t in traj.turns if t.revision > self._processed.get(key, {}).get(t.interaction_id, 0)]
                if not new_turns:
                    continue
                changed |= self._count_outcomes(key, items, new_turns, now)
                business = self.business_data(split_key(key)[0])
                names = sorted(names_from_user_texts(traj.user_texts, business))
                for cand in ex.candidates:
                    v = self._curate(snap, cand, names, now, business)
                    verdicts.append(v)
                    if v.outcome in ("added", "merged"):
                        changed = True
                        added += v.outcome == "added"
                        merged += v.outcome == "merged"
                for t in new_turns:
                    snap.processed.add(interaction_id=t.interaction_id, revision=t.revision)
                if ex.extractor_model:
                    snap.extractor_model = ex.extractor_model
                    snap.extractor_policy_version = ex.policy_version
            if not changed:
                return None, verdicts
            evicted = self.curator.over_cap(items, self.max_tokens)
            if evicted:
                keep = [it for it in items if it.item_id not in set(evicted)]
                del items[:]
                items.extend(keep)
            self._bound(snap)
            snap.change = (f"extract: {len(batch)} trajectories, +{added} items, {merged} merged"
                           + (f", {len(evicted)} evicted by the token cap" if evicted else ""))
            return self._commit(snap), verdicts

    def _count_outcomes(self, key: str, items: Iterable[events_pb2.KnowledgeItem], turns: Sequence,
                        now: Timestamp) -> bool:
        """ACE-style counters: items that were in context when the turn succeeded count as helpful, when it
        failed as harmful. In context = the items the interaction names (`knowledge_items`, recorded by the
        serving pod); for an interaction that names none, every reviewed item of its `knowledge_version`."""
        changed = False
        by_id = {it.item_id: it for it in items}
        for t in turns:
            if not t.has_signal:
                continue
            if t.knowledge_items:
                ids = [iid for k, iid in t.knowledge_items if k == key]
            else:
                version = parse_knowledge_version(t.knowledge_version, key)
                ctx = self._history.get(key, {}).get(version) if version is not None else None
                ids = [old.item_id for old in ctx.items if old.status in TRAINING] if ctx is not None else []
            for iid in ids:
                it = by_id.get(iid)
                if it is None:
                    continue
                if t.success:
                    it.helpful += 1
                else:
                    it.harmful += 1
                it.updated_at.CopyFrom(now)
                changed = True
        return changed

    def _curate(self, snap: events_pb2.KnowledgeSnapshot, cand: Candidate, names: Sequence[str],
                now: Timestamp, business: BusinessData = NO_DATA) -> Verdict:
        text = cand.text.strip()
        reason = self.curator.rejection(text, names, business)
        if reason:
            return Verdict(text, "rejected", reason)
        tenant, _ = split_key(snap.key)
        dup = self.curator.duplicate_of(text, snap.items, cand.questions)
        if dup is not None:
            idx, how = dup
            it = snap.items[idx]
            fresh = [s for s in cand.sources if s not in it.source_interaction_ids]
            if not fresh:
                return Verdict(text, "duplicate", how, it.item_id)
            it.source_interaction_ids.extend(fresh)
            self._add_questions(it, cand.questions)
            it.updated_at.CopyFrom(now)
            self._note(it, "merged", cand.by.principal(), tenant, now, fresh, cand.created_by, cand.detail,
                       text=text if normalise(text) != normalise(it.text) else "")
            return Verdict(text, "merged", how, it.item_id)
        flags = self.screen.flags(text)
        auto = not self.requires_approval(tenant) and cand.by.trusted and not flags
        it = snap.items.add(item_id=item_id(text), text=text, created_by=cand.created_by,
                            status=S.ITEM_STATUS_APPROVED if auto else S.ITEM_STATUS_PROPOSED,
                            token_count=self.curator.count_tokens(text), revision=1)
        self._add_questions(it, cand.questions)
        it.source_interaction_ids.extend(dict.fromkeys(cand.sources))
        it.screen_flags.extend(flags)
        it.created_at.CopyFrom(now)
        it.updated_at.CopyFrom(now)
        self._note(it, "created", cand.by.principal(), tenant, now, it.source_interaction_ids, cand.created_by,
                   cand.detail)
        if auto:
            self._note(it, "auto_approved", cand.by.principal(), tenant, now, (), cand.created_by,
                       f"tenant {tenant} auto-approves trusted {cand.by.role} sources")
            self._supersede(snap, it, now, cand.by.principal())
        return Verdict(text, "added", "", it.item_id, tuple(flags))

    def _add_questions(self, it: events_pb2.KnowledgeItem, questions: Sequence[str]) -> None:
        """Keep the newest `max_questions` distinct questions and recompute the answer terms (a question's
        own words prove nothing in an answer, so more questions can drop terms)."""
        known = {normalise(q) for q in it.questions}
        fresh = [q for q in dict.fromkeys(questions) if q.strip() and normalise(q) not in known]
        if fresh:
            keep = [*it.questions, *fresh][-self.max_questions:]
            del it.questions[:]
            it.questions.extend(keep)
        del it.answer_terms[:]
        it.answer_terms.extend(answer_terms(it.text, list(it.questions)))

    def _supersede(self, snap: events_pb2.KnowledgeSnapshot, new: events_pb2.KnowledgeItem, now: Timestamp,
                   who: common_pb2.Principal | None) -> list[str]:
        """`new` was just approved: every older reviewed item it contradicts is retired (kept, with the reason
        and the newer item's id), so the two are never served together and neither is lost."""
        retired = []
        tenant = split_key(snap.key)[0]
        for old in snap.items:
            if old.item_id == new.item_id or old.status not in TRAINING or old.status == S.ITEM_STATUS_PINNED:
                continue
            if self.curator.contradicts(new, old):
                old.status = S.ITEM_STATUS_RETIRED
                old.superseded_by = new.item_id
                old.retired_reason = f"superseded by {new.item_id}: {new.text[:200]}"
                old.updated_at.CopyFrom(now)
                self._note(old, "superseded", who, tenant, now, (), "extractor", old.retired_reason,
                           other=new.item_id)
                retired.append(old.item_id)
        return retired

    def _note(self, it: events_pb2.KnowledgeItem, action: str, who: common_pb2.Principal | None, tenant: str,
              at: Timestamp, interaction_ids: Iterable[str] = (), source: str = "", detail: str = "", *,
              text: str = "", other: str = "") -> None:
        """Append one provenance entry; beyond `max_provenance`, the oldest after the creation go."""
        p = it.provenance.add(action=action, tenant=tenant, source=source, detail=detail, text=text,
                              other_item_id=other)
        if who is not None:
            p.principal.CopyFrom(who)
        p.interaction_ids.extend(interaction_ids)
        p.at.CopyFrom(at)
        excess = len(it.provenance) - max(2, self.max_provenance)
        if excess > 0:
            del it.provenance[1:1 + excess]

    def _bound(self, snap: events_pb2.KnowledgeSnapshot) -> None:
        rejected = [it.item_id for it in snap.items if it.status == S.ITEM_STATUS_REJECTED]
        drop = set(rejected[: max(0, len(rejected) - self.max_rejected_kept)])
        if drop:
            keep = [it for it in snap.items if it.item_id not in drop]
            del snap.items[:]
            snap.items.extend(keep)
        # processed: newest last; keep one entry per interaction (its highest revision), bounded
        latest: dict[str, int] = {}
        for p in snap.processed:
            latest.pop(p.interaction_id, None)
            latest[p.interaction_id] = max(p.revision, latest.get(p.interaction_id, 0))
        kept = list(latest.items())[-self.max_processed_kept:]
        del snap.processed[:]
        for iid, rev in kept:
            snap.processed.add(interaction_id=iid, revision=rev)

    # --- operator actions --------------------------------------------------------------------------------
    def act(self, key: str, item_id_: str, action: str, operator: str = "", text: str = "", *,
            by: common_pb2.Principal | None = None, override_screen: bool = False) -> events_pb2.KnowledgeSnapshot:
        """approve | reject | pin | edit one item by the caller `by`; a no-op action returns the current
        snapshot unchanged. An edit runs the injection screen and is refused when the new text is flagged;
        approving or pinning a flagged item needs `override_screen` (the operator read the flags)."""
        target = {"approve": S.ITEM_STATUS_APPROVED, "reject": S.ITEM_STATUS_REJECTED, "pin": S.ITEM_STATUS_PINNED,
                  "retire": S.ITEM_STATUS_RETIRED, "restore": S.ITEM_STATUS_APPROVED}
        done = {"approve": "approved", "reject": "rejected", "pin": "pinned", "edit": "edited", "retire": "retired",
                "restore": "restored", "split": "split"}
        if action == "split":
            return self._split(key, item_id_, text, operator, by)
        with self._lock:
            if key not in self._latest:
                raise NotFound(f"no knowledge base {key!r}")
            cur = self._latest[key]
            idx = next((i for i, it in enumerate(cur.items) if it.item_id == item_id_), None)
            if idx is None:
                raise NotFound(f"{key!r} has no item {item_id_!r}")
            who = operator or (by.key_id if by is not None else "") or "operator"
            if action == "edit":
                new_text = text.strip()
                reason = self.curator.rejection(new_text, business=self.business_data(split_key(key)[0]))
                if reason:
                    raise InvalidRequest(f"edited text rejected: {reason}")
                flags = self.screen.flags(new_text)
                if flags:
                    raise InvalidRequest(f"edited text rejected by the injection screen ({', '.join(flags)}): "
                                         "knowledge states facts; it may not address the model")
                if new_text == cur.items[idx].text:
                    return _copy(cur)
                others = [it for i, it in enumerate(cur.items) if i != idx]
                dup = self.curator.duplicate_of(new_text, others, facts=False)   # an operator's wording is deliberate
                if dup is not None:
                    raise InvalidRequest(f"edited text duplicates item {others[dup[0]].item_id} ({dup[1]})")
                snap = self._next(key, f"edit item {item_id_} by {who}")
                it = snap.items[idx]
                it.text = new_text
                it.token_count = self.curator.count_tokens(new_text)
                it.revision = max(1, it.revision) + 1
                self._add_questions(it, ())
                if it.status == S.ITEM_STATUS_CONSOLIDATED:   # the weights held the old text, not this one
                    it.status = S.ITEM_STATUS_APPROVED
                del it.screen_flags[:]
            elif action in target:
                if action == "restore" and cur.items[idx].status != S.ITEM_STATUS_RETIRED:
                    raise FailedPrecondition(f"item {item_id_} is not retired; only a retired item can be restored")
                if cur.items[idx].status == target[action]:
                    return _copy(cur)
                flagged = list(cur.items[idx].screen_flags)
                if flagged and action in ("approve", "pin", "restore") and not override_screen:
                    raise FailedPrecondition(f"item {item_id_} is flagged by the injection screen "
                                             f"({', '.join(flagged)}); read it, then {action} it with the "
                                             "screen override, or edit it first")
                snap = self._next(key, f"{action} item {item_id_} by {who}")
                it = snap.items[idx]
                it.status = target[action]
                if action == "retire":
                    it.retired_reason = f"retired by operator {who}"
                elif action == "restore":
                    it.retired_reason = it.superseded_by = ""
            else:
                raise InvalidRequest(f"unknown action {action!r}; use approve, reject, pin, edit, retire, restore "
                                     "or split")
            now = self._clock()
            it.edited_by = who
            it.updated_at.CopyFrom(now)
            self._note(it, done[action], by, split_key(key)[0], now, (), "operator",
                       f"operator {who}" + ("; screen flags overridden" if override_screen and it.screen_flags else ""))
            if action in ("approve", "pin"):
                self._supersede(snap, it, now, by)
            return self._commit(snap)

    def _split(self, key: str, item_id_: str, text: str, operator: str,
               by: common_pb2.Principal | None) -> events_pb2.KnowledgeSnapshot:
        """Undo a merge: the merged text `text` (a `merged` provenance entry of the item) leaves the item and
        becomes a proposal of its own, with that entry's sources and the questions they asked."""
        with self._lock:
            cur = self._latest.get(key)
            if cur is None:
                raise NotFound(f"no knowledge base {key!r}")
            idx = next((i for i, it in enumerate(cur.items) if it.item_id == item_id_), None)
            if idx is None:
                raise NotFound(f"{key!r} has no item {item_id_!r}")
            entry = next((p for p in cur.items[idx].provenance if p.action == "merged" and p.text
                          and p.text.strip() == text.strip()), None)
            if entry is None:
                merged = [p.text for p in cur.items[idx].provenance if p.action == "merged" and p.text]
                raise InvalidRequest(f"item {item_id_} has no merge of that text; its merged texts: "
                                     f"{merged[:5] or 'none (only exact restatements were merged)'}")
            if any(it.item_id == item_id(entry.text) for it in cur.items):
                raise FailedPrecondition(f"that text was already split off item {item_id_} (item "
                                         f"{item_id(entry.text)} exists)")
            who = operator or (by.key_id if by is not None else "") or "operator"
            snap = self._next(key, f"split {item_id(entry.text)} off item {item_id_} by {who}")
            now = self._clock()
            old = snap.items[idx]
            moved = set(entry.interaction_ids)
            keep = [i for i in old.source_interaction_ids if i not in moved]
            del old.source_interaction_ids[:]
            old.source_interaction_ids.extend(keep)
            tenant = split_key(key)[0]
            self._note(old, "split", by, tenant, now, entry.interaction_ids, "operator", f"operator {who}",
                       text=entry.text, other=item_id(entry.text))
            new = snap.items.add(item_id=item_id(entry.text), text=entry.text, created_by=entry.source,
                                 status=S.ITEM_STATUS_PROPOSED, token_count=self.curator.count_tokens(entry.text),
                                 revision=1, screen_flags=self.screen.flags(entry.text))
            new.source_interaction_ids.extend(entry.interaction_ids)
            self._add_questions(new, ())
            new.created_at.CopyFrom(now)
            new.updated_at.CopyFrom(now)
            self._note(new, "created", by, tenant, now, entry.interaction_ids, "operator",
                       f"split off {item_id_} by operator {who}", other=item_id_)
            return self._commit(snap)

    # --- consolidation (the eval gate's per-item checks of a promoted version) -----------------------------
    def consolidate(self, tenant: str, version: str, held: dict[tuple[str, str], tuple[int, bool]],
                    ) -> list[events_pb2.KnowledgeSnapshot]:
        """A version was promoted for `tenant`: `held[(key, item_id)] = (revision, held)` are its gate's checks.
        An APPROVED item it holds (at the item's current revision) becomes CONSOLIDATED (leaves the serving
        context); a CONSOLIDATED item it does not hold, or did not check, comes back (APPROVED). Returns the
        new durable snapshots (none when nothing changed)."""
        out = []
        with self._lock:
            for key in [k for k in self._latest if split_key(k)[0] == tenant]:
                snap = self._next(key, f"consolidation by {version}")
                now = self._clock()
                moved = []
                for it in snap.items:
                    rev, ok = held.get((key, it.item_id), (-1, False))
                    ok = ok and rev == it.revision
                    if it.status == S.ITEM_STATUS_APPROVED and ok:
                        it.status, it.consolidated_in, it.lost_in = S.ITEM_STATUS_CONSOLIDATED, version, ""
                        self._note(it, "consolidated", None, tenant, now, (), "weights",
                                   f"{version} answers its questions without it")
                    elif it.status == S.ITEM_STATUS_CONSOLIDATED and not ok:
                        it.status, it.lost_in = S.ITEM_STATUS_APPROVED, version
                        why = "does not answer its questions" if rev >= 0 else "was not checked on it"
                        self._note(it, "unconsolidated", None, tenant, now, (), "weights", f"{version} {why}")
                    else:
                        continue
                    it.updated_at.CopyFrom(now)
                    moved.append(it.item_id)
                if moved:
                    snap.change = f"consolidation by {version}: {len(moved)} item(s) changed state"
                    out.append(self._commit(snap))
        return out


def training_view(snap: events_pb2.KnowledgeSnapshot) -> events_pb2.KnowledgeSnapshot:
    """Only the items that may reach the trainer: APPROVED and PINNED."""
    out = _copy(snap)
    keep = [it for it in out.items if it.status in TRAINING]
    del out.items[:]
    out.items.extend(keep)
    return out


def _copy(snap: events_pb2.KnowledgeSnapshot) -> events_pb2.KnowledgeSnapshot:
    out = events_pb2.KnowledgeSnapshot()
    out.CopyFrom(snap)
    return out
