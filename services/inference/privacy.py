"""A request's prompt before it is served, and the Interaction / FeedbackEvent about to be captured --> the
same with personal data redacted, or the call refused, by the tenant's PII policy
(`APPRENTICE_INFERENCE_PII_POLICY`, `..._PII_TENANT_POLICIES`).

Runs on the request thread, so unredacted text never reaches the spool or a topic (and so never the grader's
`graded` records or the extractor's knowledge). Each text goes through the detector once per request: the
prompt's messages are scanned by their first reader (the edge under `reject`, which must decide before
anything is served; else `redact_prompt`) and the scans ride on the `PreparedRequest`; each answer and each
feedback comment is scanned once.
- prompt (messages, tool calls' arguments, tool definitions, raw prompt), before it is served
  (`redact_prompt`, on a request that will be captured): each span becomes `<ENTITY_TYPE>` and the request's
  one prompt is rebuilt from the redacted text (services/inference/prompt.py). The model answers from that
  prompt, and every choice's Interaction records it: the same text, the same token ids, so the behaviour
  log-probs the trainer reads were computed under the prompt it learns from. A request that is not captured
  (`no_capture`, an opted-out tenant, capture off) and a `keep` tenant's are served as sent.
- answer: when the model's answer contains personal data (any structured type, or a name the prompt
  gave: answers are not read with NER, see `Redactor.scan_answer`), `response_text` is redacted and the
  answer's token ids and log-probs are dropped: the redacted text is not what the model generated, and RL must not
  reinforce placeholder tokens the policy never sampled. The trainer skips such a rollout (counted as
  "malformed": no response tokens); the grader and extractor still use its redacted text.
- feedback comment: redacted in place (the event id still hashes the comment as sent, so a retried
  submission is still recognised as the same event).
Each tenant's declared public business data (`APPRENTICE_BUSINESS_NAMES`, `APPRENTICE_BUSINESS_DATA`,
`shared.privacy.business`) is kept in all three: a detected name that is only one of its names, or a phone
number, e-mail, web or street address that is only its declared one, is the business's, not a user's personal
data (another tenant's declaration keeps nothing here).
`reject` applies to what callers send (prompt messages, comments) and only where it would be captured; an
answer that contains personal data under `reject` is redacted.
The session id (the caller's, or the OpenAI `user` field) is replaced by its keyed pseudonym under every
policy (shared/security/pseudonyms.py), so neither the topic record, its Kafka key nor the spool holds it.
A detector failure fails closed: the prompt is served as sent and the captured copy keeps its ids and metadata
but none of its text (`<REDACTION_FAILED>`), with an error log and a metric; the caller still gets the answer.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence, Set
from typing import Any

from services.inference import metrics
from services.inference.requests import PreparedRequest
from services.inference.settings import InferenceSettings
from shared.decoding.tool_calls import ToolSpec
from shared.privacy.policy import PiiPolicy, Redactor, Scan, entity_types, parse_tenant_policies
from shared.proto.apprentice.v1 import common_pb2, events_pb2
from shared.rpc.grpc_util import InvalidRequest
from shared.security.pseudonyms import SessionPseudonyms

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
        self.sessions = SessionPseudonyms(settings.common.interaction_id_key())
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

    def _scan(self, text: str, where: str, tenant: str, answer_names: Set[str] | None = None) -> Scan:
        """A scan of `text` captured for `tenant` (its declared business data is kept); with
        `answer_names`, read as a model answer (`Redactor.scan_answer`)."""
        t0 = time.perf_counter()
        business = self.settings.common.business_data_for(tenant)
        scan = (self.redactor.scan(text, tenant=tenant, business=business) if answer_names is None
                else self.redactor.scan_answer(text, answer_names, business, tenant=tenant))
        metrics.PII_SCAN_SECONDS.observe(time.perf_counter() - t0)
        for span in scan.spans:
            metrics.PII_FOUND.labels(entity=span.entity, where=where).inc()
        return scan

    # --- Generate -------------------------------------------------------------------------------------
    def prompt_scans(self, p: PreparedRequest) -> tuple[Scan, ...]:
        """One scan per message of the request, made by the first caller and kept on `p`: under `reject`
        the edge (`screen_request`) scans and `redact_prompt` reuses its scans; otherwise `redact_prompt`
        scans, before anything is served, once for all of the request's choices. The messages are read as one
        conversation (`Redactor.scan_conversation`): an e-mail, phone number or IBAN split across two
        messages is found in both halves, which a scan of each message alone misses."""
        if p.prompt_scans is None:
            t0 = time.perf_counter()
            scans = self.redactor.scan_conversation(
                [m.content for m in p.messages], [m.role for m in p.messages], tenant=p.tenant,
                business=self.settings.common.business_data_for(p.tenant))
            metrics.PII_SCAN_SECONDS.observe(time.perf_counter() - t0)
            for scan in scans:
                for span in scan.spans:
                    metrics.PII_FOUND.labels(entity=span.entity, where="prompt").inc()
            p.prompt_scans = tuple(scans)
        return p.prompt_scans

    def screen_request(self, p: PreparedRequest) -> None:
        """`reject`: refuse a request whose messages hold personal data, naming the types (never the
        values). Other policies (and requests that are not captured) pass without a scan."""
        if self.settings.pii_policy_for(p.tenant) is not PiiPolicy.REJECT or not self._captured(p.tenant, p.no_capture):
            return
        found = {t for scan in self.prompt_scans(p) for t in scan.types}
        found |= {t for scan in self._tool_scans(p) for t in scan.types}
        if found:
            metrics.PII_REJECTED.labels(kind="generate").inc()
            raise InvalidRequest(
                f"the prompt contains personal data ({', '.join(sorted(found))}) and tenant {p.tenant!r} does "
                "not accept it: remove it, or send the request with no_capture=true")

    def redact_prompt(self, p: PreparedRequest) -> None:
        """Before serving: replace personal data in the prompt of a request that will be captured (not under
        `keep`), so the prompt the model answers from is the one its interactions record. The messages'
        content and tool calls' arguments are scanned (`prompt_scans`, once), the tool definitions too
        (`_tool_scans`), and `p.prompt` is rebuilt from the redacted text (services/inference/prompt.py; the
        notes it holds are kept). Sets `p.prompt_privacy`; a detector failure serves the prompt as sent and
        marks it `failed`, so `interactions` keeps none of its text."""
        if self.settings.pii_policy_for(p.tenant) is PiiPolicy.KEEP or not self._captured(p.tenant, p.no_capture):
            p.prompt_privacy = "as_sent"
            return
        try:
            scans = self.prompt_scans(p)
            # tool calls' arguments are text the caller sent too (an agent's history): scanned like content
            arg_scans = [[self._scan(c.arguments, "tool_arguments", p.tenant) for c in m.tool_calls]
                         for m in p.messages]
            tools = self._redacted_tools(p)
            if not any(scan.spans for scan in scans) and not any(a.spans for row in arg_scans for a in row) \
                    and tools is None:
                p.prompt_privacy = "as_sent"
                return
            messages = []
            for m, scan, args in zip(p.messages, scans, arg_scans, strict=True):
                clean = common_pb2.ChatMessage()
                clean.CopyFrom(m)
                clean.content = scan.redacted
                for call, a in zip(clean.tool_calls, args, strict=True):
                    call.arguments = a.redacted
                messages.append(clean)
            p.prompt = p.prompt.redact(self._tokenizer(), messages, p.prompt.tools if tools is None else tools)
            p.prompt_privacy = "redacted"
        except Exception:       # noqa: BLE001 - fail closed, keep serving
            log.exception("PII redaction of a prompt failed; it is served as sent and its captured interactions "
                          "keep no text")
            p.prompt_privacy = "failed"

    def interactions(self, p: PreparedRequest, events: Sequence[events_pb2.Interaction]
                     ) -> Sequence[events_pb2.Interaction]:
        """Redact the captured copies of one request's choices (in place; returned for chaining). `keep`
        returns them untouched. Their prompt is `p.prompt`, already redacted before it was served
        (`redact_prompt`); here each answer is scanned once, for any structured type and the names the
        prompt gave. A prompt that was never checked, or whose check failed, is not kept: the events lose
        their text (fail closed).
        Under every policy the session id becomes its keyed pseudonym (shared/security/pseudonyms.py): it
        is the caller's identifier (often the OpenAI `user` field), and consumers only group by it."""
        session = self.sessions(p.tenant, p.session_id)
        for ev in events:
            ev.session_id = session
        if self.settings.pii_policy_for(p.tenant) is PiiPolicy.KEEP:
            return events
        if p.prompt_privacy not in ("as_sent", "redacted"):
            if p.prompt_privacy == "unchecked":
                log.error("a prompt reached the capture without its PII check (redact_prompt); its captured "
                          "interactions keep no text", extra={"interaction_ids": [ev.interaction_id for ev in events]})
            for ev in events:
                _scrub(ev)
            return events
        names = frozenset(w for scan in (p.prompt_scans or ()) for w in scan.names())
        for ev in events:
            try:
                self._redact_answer(ev, names, p.prompt.redacted)
            except Exception:   # noqa: BLE001 - fail closed, keep serving
                log.exception("PII redaction failed; the captured interaction keeps no text",
                              extra={"interaction_id": ev.interaction_id})
                _scrub(ev)
        return events

    def _tool_scans(self, p: PreparedRequest) -> tuple[Scan, ...]:
        """One scan per offered tool of its definition as JSON (description, schema: descriptions, enums,
        defaults, examples): a backend writes them, but they may carry what a user typed or a customer's
        data, and they are rendered into the prompt the trainer learns from. Made once per request and
        kept on `p` (as `prompt_scans`); an agent sends the same tools every turn, so the redactor's
        per-tenant cache answers most of them."""
        if p.tool_scans is None:
            p.tool_scans = tuple(
                self._scan(json.dumps({"description": t.description, "parameters": dict(t.parameters)},
                                      ensure_ascii=False), "tool_definitions", p.tenant) for t in p.tools)
        return p.tool_scans

    def _redacted_tools(self, p: PreparedRequest) -> list[ToolSpec] | None:
        """The offered tools with personal data replaced in every string of their definitions (so the
        schema stays a schema); None when no definition holds any."""
        scans = self._tool_scans(p)
        if not any(scan.spans for scan in scans):
            return None

        def clean(value: Any) -> Any:
            if isinstance(value, str):
                return self._scan(value, "tool_definitions", p.tenant).redacted
            if isinstance(value, list):
                return [clean(v) for v in value]
            if isinstance(value, dict):
                return {k: clean(v) for k, v in value.items()}
            return value

        return [dataclasses.replace(t, description=clean(t.description), parameters=clean(dict(t.parameters)))
                if scan.spans else t for t, scan in zip(p.tools, scans, strict=True)]

    def _redact_answer(self, ev: events_pb2.Interaction, names: frozenset[str], prompt_redacted: bool) -> None:
        answer = self._scan(ev.response_text, "response", ev.envelope.tenant, names)
        if answer.spans:
            ev.response_text = answer.redacted
            del ev.response_token_ids[:]
            del ev.response_logprobs[:]
            del ev.response_logprobs_t1[:]
        for call in ev.response_tool_calls:
            found = self._scan(call.arguments, "response", ev.envelope.tenant, names)
            if found.spans:
                call.arguments = found.redacted
        if prompt_redacted or answer.spans:
            metrics.PII_REDACTED.labels(kind="interaction").inc()

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


def _scrub(ev: events_pb2.Interaction) -> None:
    """Fail closed: the captured copy keeps its ids and metadata but none of its text."""
    metrics.PII_REDACTED.labels(kind="failed").inc()
    for m in ev.messages:
        m.content = FAILED
        for call in m.tool_calls:
            call.arguments = FAILED
    for call in ev.response_tool_calls:
        call.arguments = FAILED
    for tool in ev.tools:
        tool.description, tool.parameters_json = FAILED, "{}"
    ev.prompt_text = ev.response_text = FAILED
    for tokens in (ev.prompt_token_ids, ev.response_token_ids, ev.response_logprobs, ev.response_logprobs_t1):
        del tokens[:]
