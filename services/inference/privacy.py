"""Interaction / FeedbackEvent about to be captured --> the same with personal data redacted, or the call
refused, by the tenant's PII policy (`APPRENTICE_INFERENCE_PII_POLICY`, `..._PII_TENANT_POLICIES`).

Runs on the request thread before `CaptureSink.submit`, so unredacted text never reaches the spool or a
topic (and so never the grader's `graded` records or the extractor's knowledge). The model is not
affected: it answers from the unredacted prompt; only the captured record changes:
- messages and raw prompt: each span becomes `<ENTITY_TYPE>`; `prompt_text` is re-rendered from the
  redacted messages with the chat template and `prompt_token_ids` re-tokenised from it, so the trainer's
  prompt is the text the grader and extractor see. The recorded behaviour log-probs stay: they were
  computed under the original prompt, and the trainer's truncated importance weight
  min(pi_old(y | redacted prompt) / pi_rollout(y | original prompt), C) accounts for that change.
- answer: when the model's answer contains personal data (any structured type, or a name the prompt
  gave: answers are not read with NER, see `Redactor.scan_answer`), `response_text` is redacted and the
  answer's token ids and log-probs are dropped: the redacted text is not what the model generated, and RL must not
  reinforce placeholder tokens the policy never sampled. The trainer skips such a rollout (counted as
  "malformed": no response tokens); the grader and extractor still use its redacted text.
- feedback comment: redacted in place (the event id still hashes the comment as sent, so a retried
  submission is still recognised as the same event).
Each tenant's declared business names (`APPRENTICE_BUSINESS_NAMES`, `shared.privacy.business`) are kept in all
three: a detected name that is only one of them is the business's word, not a user's personal data.
`reject` applies to what callers send (prompt messages, comments) and only where it would be captured; an
answer that contains personal data under `reject` is redacted.
A detector failure fails closed: the captured copy keeps its ids and metadata but none of its text
(`<REDACTION_FAILED>`), with an error log and a metric; the caller still gets the answer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from services.inference import metrics
from services.inference.requests import PreparedRequest
from services.inference.settings import InferenceSettings
from shared.decoding.chat_template import encode_chat
from shared.decoding.generation import encode_prompt
from shared.knowledge.frame import with_knowledge
from shared.privacy.policy import PiiPolicy, Redactor, Scan, entity_types, parse_tenant_policies
from shared.proto.apprentice.v1 import events_pb2
from shared.rpc.grpc_util import InvalidRequest

log = logging.getLogger(__name__)

FAILED = "<REDACTION_FAILED>"


class CapturePrivacy:
    """The capture edge's PII policy. `tokenizer` returns the serving tokenizer (read when needed: the
    engine loads it after this object exists)."""

    def __init__(self, settings: InferenceSettings, tokenizer: Callable[[], Any],
                 redactor: Redactor | None = None) -> None:
        self.settings = settings
        self._tokenizer = tokenizer
        self.redactor = redactor or Redactor()
        self._warming: threading.Thread | None = None

    @property
    def active(self) -> bool:
        """False when every tenant keeps text as is (the detector is then never built)."""
        s = self.settings
        return s.capture and (s.pii_policy is not PiiPolicy.KEEP or any(
            p is not PiiPolicy.KEEP for p in self._overrides().values()))

    def _overrides(self) -> dict[str, PiiPolicy]:
        return parse_tenant_policies(self.settings.pii_tenant_policies)

    def start_warming(self) -> None:
        """Build the detector (seconds) on a background thread, alongside the model load."""
        if self.active and self._warming is None:
            self._warming = threading.Thread(target=self._warm, name="pii-warm", daemon=True)
            self._warming.start()

    def wait_warm(self) -> None:
        """Block until the detector is built (before reporting SERVING: no first request waits on it)."""
        if self._warming is not None:
            self._warming.join()

    def _warm(self) -> None:
        try:
            self.redactor.warm()
        except Exception:       # noqa: BLE001 - the first capture retries the build and fails closed
            log.exception("PII detector failed to build; captures will be scrubbed until it does")

    def _captured(self, tenant: str, no_capture: bool = False) -> bool:
        s = self.settings
        return s.capture and not no_capture and tenant not in s.no_capture_tenants

    def _scan(self, text: str, where: str, tenant: str, answer_names: set[str] | None = None) -> Scan:
        """A scan of `text` captured for `tenant` (its declared business names are kept); with
        `answer_names`, read as a model answer (`Redactor.scan_answer`)."""
        t0 = time.perf_counter()
        business = self.settings.common.business_names_for(tenant)
        scan = (self.redactor.scan(text, business=business) if answer_names is None
                else self.redactor.scan_answer(text, answer_names, business))
        metrics.PII_SCAN_SECONDS.observe(time.perf_counter() - t0)
        for span in scan.spans:
            metrics.PII_FOUND.labels(entity=span.entity, where=where).inc()
        return scan

    # --- Generate -------------------------------------------------------------------------------------
    def screen_request(self, p: PreparedRequest) -> None:
        """`reject`: refuse a request whose messages hold personal data, naming the types (never the
        values). Other policies (and requests that are not captured) pass."""
        if self.settings.pii_policy_for(p.tenant) is not PiiPolicy.REJECT or not self._captured(p.tenant, p.no_capture):
            return
        found: set[str] = set()
        for m in p.messages:
            found.update(self._scan(m.content, "prompt", p.tenant).types)
        if found:
            metrics.PII_REJECTED.labels(kind="generate").inc()
            raise InvalidRequest(
                f"the prompt contains personal data ({', '.join(sorted(found))}) and tenant {p.tenant!r} does "
                "not accept it: remove it, or send the request with no_capture=true")

    def interaction(self, ev: events_pb2.Interaction, knowledge: Sequence[str] = ()) -> events_pb2.Interaction:
        """Redact the captured copy (in place; returned for chaining). `keep` returns it untouched.
        `knowledge`: the item texts that were in the prompt's context (re-rendered with the redacted
        messages, so the recorded prompt is still what the model saw, less the personal data)."""
        if self.settings.pii_policy_for(ev.envelope.tenant) is PiiPolicy.KEEP:
            return ev
        try:
            return self._redact_interaction(ev, knowledge)
        except Exception:       # noqa: BLE001 - fail closed, keep serving
            log.exception("PII redaction failed; the captured interaction keeps no text",
                          extra={"interaction_id": ev.interaction_id})
            metrics.PII_REDACTED.labels(kind="failed").inc()
            for m in ev.messages:
                m.content = FAILED
            ev.prompt_text = ev.response_text = FAILED
            for field in (ev.prompt_token_ids, ev.response_token_ids, ev.response_logprobs, ev.response_logprobs_t1):
                del field[:]
            return ev

    def _redact_interaction(self, ev: events_pb2.Interaction, knowledge: Sequence[str]) -> events_pb2.Interaction:
        changed_prompt = False
        names: set[str] = set()
        tenant = ev.envelope.tenant
        for m in ev.messages:
            scan = self._scan(m.content, "prompt", tenant)
            names |= scan.names()
            if scan.spans:
                m.content = scan.redacted
                changed_prompt = True
        if changed_prompt:
            tok = self._tokenizer()
            if ev.raw_prompt:
                ev.prompt_text = ev.messages[0].content
                ev.prompt_token_ids[:] = encode_prompt(tok, ev.prompt_text)
            else:
                msgs = [{"role": m.role, "content": m.content} for m in ev.messages]
                chat = encode_chat(tok, with_knowledge(msgs, knowledge))
                ev.prompt_text, ev.prompt_token_ids[:] = chat.text, chat.ids
        answer = self._scan(ev.response_text, "response", tenant, names)
        if answer.spans:
            ev.response_text = answer.redacted
            del ev.response_token_ids[:]
            del ev.response_logprobs[:]
            del ev.response_logprobs_t1[:]
        if changed_prompt or answer.spans:
            metrics.PII_REDACTED.labels(kind="interaction").inc()
        return ev

    # --- Feedback -------------------------------------------------------------------------------------
    def feedback(self, ev: events_pb2.FeedbackEvent) -> events_pb2.FeedbackEvent:
        """Redact the comment (`redact`), refuse it (`reject`, types named), or keep it."""
        tenant = ev.envelope.tenant
        policy = self.settings.pii_policy_for(tenant)
        if policy is PiiPolicy.KEEP or not ev.comment or not self._captured(tenant):
            return ev
        try:
            scan = self._scan(ev.comment, "feedback", tenant)
        except Exception:       # noqa: BLE001 - fail closed, keep serving
            log.exception("PII scan of a feedback comment failed; the comment is not kept")
            metrics.PII_REDACTED.labels(kind="failed").inc()
            ev.comment = FAILED
            return ev
        if not scan.spans:
            return ev
        if policy is PiiPolicy.REJECT:
            metrics.PII_REJECTED.labels(kind="feedback").inc()
            raise InvalidRequest(f"the comment contains personal data ({', '.join(entity_types(scan.spans))}) "
                                 f"and tenant {tenant!r} does not accept it: remove it and send again")
        ev.comment = scan.redacted
        metrics.PII_REDACTED.labels(kind="feedback").inc()
        return ev
