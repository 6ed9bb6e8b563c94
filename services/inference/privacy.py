"""Interaction / FeedbackEvent about to be captured --> the same with personal data redacted, or the call
refused, by the tenant's PII policy (`APPRENTICE_INFERENCE_PII_POLICY`, `..._PII_TENANT_POLICIES`).

Runs on the request thread before `CaptureSink.submit`, so unredacted text never reaches the spool or a
topic (and so never the grader's `graded` records or the extractor's knowledge). Each text goes through
the detector once per request: the prompt's messages are scanned by their first reader (the edge under
`reject`, which must decide before anything is served; else the capture) and the scans ride on the
`PreparedRequest` to the capture of every choice; each answer and each feedback comment is scanned once.
The model is not affected: it answers from the unredacted prompt; only the captured record changes:
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
The session id (the caller's, or the OpenAI `user` field) is replaced by its keyed pseudonym under every
policy (shared/security/pseudonyms.py), so neither the topic record, its Kafka key nor the spool holds it.
A detector failure fails closed: the captured copy keeps its ids and metadata but none of its text
(`<REDACTION_FAILED>`), with an error log and a metric; the caller still gets the answer.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass, field
from typing import Any

from services.inference import metrics
from services.inference.requests import PreparedRequest
from services.inference.settings import InferenceSettings
from shared.decoding.chat_template import encode_chat, encode_text
from shared.decoding.tool_calls import ToolSpec, render_hermes
from shared.knowledge.frame import with_knowledge
from shared.privacy.policy import PiiPolicy, Redactor, Scan, entity_types, parse_tenant_policies
from shared.proto.apprentice.v1 import events_pb2
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
        """A scan of `text` captured for `tenant` (its declared business names are kept); with
        `answer_names`, read as a model answer (`Redactor.scan_answer`)."""
        t0 = time.perf_counter()
        business = self.settings.common.business_names_for(tenant)
        scan = (self.redactor.scan(text, tenant=tenant, business=business) if answer_names is None
                else self.redactor.scan_answer(text, answer_names, business, tenant=tenant))
        metrics.PII_SCAN_SECONDS.observe(time.perf_counter() - t0)
        for span in scan.spans:
            metrics.PII_FOUND.labels(entity=span.entity, where=where).inc()
        return scan

    # --- Generate -------------------------------------------------------------------------------------
    def prompt_scans(self, p: PreparedRequest) -> tuple[Scan, ...]:
        """One scan per message of the request, made by the first caller and kept on `p`: under `reject`
        the edge (`screen_request`) scans before anything is served and the capture reuses its scans;
        otherwise the capture scans, once for all of the request's choices. The messages are read as one
        conversation (`Redactor.scan_conversation`): an e-mail, phone number or IBAN split across two
        messages is found in both halves, which a scan of each message alone misses."""
        if p.prompt_scans is None:
            t0 = time.perf_counter()
            scans = self.redactor.scan_conversation(
                [m.content for m in p.messages], [m.role for m in p.messages], tenant=p.tenant,
                business=self.settings.common.business_names_for(p.tenant))
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

    def interactions(self, p: PreparedRequest, events: Sequence[events_pb2.Interaction]
                     ) -> Sequence[events_pb2.Interaction]:
        """Redact the captured copies of one request's choices (in place; returned for chaining). `keep`
        returns them untouched. The choices share the prompt: it is scanned once (`prompt_scans`),
        redacted and re-rendered once (with the knowledge that was in the context, so the recorded prompt
        is still what the model saw, less the personal data); each answer is scanned once.
        Under every policy the session id becomes its keyed pseudonym (shared/security/pseudonyms.py): it
        is the caller's identifier (often the OpenAI `user` field), and consumers only group by it."""
        session = self.sessions(p.tenant, p.session_id)
        for ev in events:
            ev.session_id = session
        if self.settings.pii_policy_for(p.tenant) is PiiPolicy.KEEP:
            return events
        try:
            prompt = self._captured_prompt(p)
        except Exception:       # noqa: BLE001 - fail closed, keep serving
            log.exception("PII redaction of a prompt failed; the request's captured interactions keep no text",
                          extra={"interaction_ids": [ev.interaction_id for ev in events]})
            for ev in events:
                _scrub(ev)
            return events
        for ev in events:
            try:
                self._redact_interaction(ev, prompt)
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

    def _captured_prompt(self, p: PreparedRequest) -> _CapturedPrompt:
        scans = self.prompt_scans(p)
        names = frozenset(w for scan in scans for w in scan.names())
        # tool calls' arguments are text the caller sent too (an agent's history): scanned like content
        arg_scans = [[self._scan(c.arguments, "tool_arguments", p.tenant) for c in m.tool_calls]
                     for m in p.messages]
        tools = self._redacted_tools(p)
        if not any(scan.spans for scan in scans) and not any(a.spans for row in arg_scans for a in row) \
                and tools is None:
            return _CapturedPrompt(names)
        contents = [scan.redacted for scan in scans]
        arguments = [[a.redacted for a in row] for row in arg_scans]
        tok = self._tokenizer()
        if p.raw_prompt:
            # as served (services/inference/requests.py): a raw prompt is content, its special-token
            # text stays text; parsing it here put forged role tokens in what the trainer learns from
            text, ids = contents[0], encode_text(tok, contents[0])
        else:
            msgs: list[dict[str, Any]] = [{"role": m.role, "content": c} for m, c in zip(p.messages, contents, strict=True)]
            if p.tools or any(m.role == "tool" or m.tool_calls for m in p.messages):
                # rendered as served (services/inference/requests.py prepare), from the redacted text
                for d, m, args in zip(msgs, p.messages, arguments, strict=True):
                    d["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": a}
                                       for c, a in zip(m.tool_calls, args, strict=True)]
                msgs = list(render_hermes(msgs, p.tools if tools is None else tools))
            chat = encode_chat(tok, with_knowledge(msgs, p.knowledge_texts))
            text, ids = chat.text, chat.ids
        return _CapturedPrompt(names, contents, arguments=arguments, text=text, ids=ids, tools=tools)

    def _redact_interaction(self, ev: events_pb2.Interaction, prompt: _CapturedPrompt) -> None:
        if prompt.contents is not None:
            for m, content in zip(ev.messages, prompt.contents, strict=True):
                m.content = content
            for m, args in zip(ev.messages, prompt.arguments or [], strict=False):
                for call, a in zip(m.tool_calls, args, strict=True):
                    call.arguments = a
            ev.prompt_text = prompt.text
            ev.prompt_token_ids[:] = prompt.ids
        if prompt.tools is not None:
            for proto, t in zip(ev.tools, prompt.tools, strict=True):
                proto.description, proto.parameters_json = t.description, json.dumps(dict(t.parameters))
        answer = self._scan(ev.response_text, "response", ev.envelope.tenant, prompt.names)
        if answer.spans:
            ev.response_text = answer.redacted
            del ev.response_token_ids[:]
            del ev.response_logprobs[:]
            del ev.response_logprobs_t1[:]
        for call in ev.response_tool_calls:
            found = self._scan(call.arguments, "response", ev.envelope.tenant, prompt.names)
            if found.spans:
                call.arguments = found.redacted
        if prompt.contents is not None or answer.spans:
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


@dataclass(frozen=True)
class _CapturedPrompt:
    """A request's prompt as every one of its choices is captured: the names its messages gave (what an
    answer is checked for), and when personal data was found, the redacted message contents and the
    prompt re-rendered from them (`contents` is None when the prompt is kept as sent)."""

    names: frozenset[str]
    contents: list[str] | None = None
    arguments: list[list[str]] | None = None
    """Per message, its tool calls' arguments redacted (set with `contents`)."""
    text: str = ""
    ids: list[int] = field(default_factory=list)
    tools: list[ToolSpec] | None = None
    """The offered tools with their definitions redacted; None when they are kept as sent."""


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
