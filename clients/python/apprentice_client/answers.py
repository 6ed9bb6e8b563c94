"""Feedback on answers obtained through the OpenAI SDK, LangChain or the Responses API, without torch or openai.

The server puts an answer's interaction ids in three places (services/inference/openai_api/responses.py):
the body's `apprentice.interaction_ids` extension (whole answers and a stream's first chunk), `id` (the
first choice's id, on every chunk) and the `x-apprentice-interaction-ids` header (comma-separated by
choice index, streams included). `interaction_id_of` reads whichever the object at hand kept, by duck
typing, so this module imports neither SDK; `feedback` sends it over the existing Feedback path: gRPC
through `InferenceClient`, or POST /v1/feedback through the OpenAI client that got the answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

IDS_HEADER = "x-apprentice-interaction-ids"
SESSION_HEADER = "x-apprentice-session-id"


class NoInteractionId(ValueError):
    """The object carries no Apprentice interaction id (not an answer of an Apprentice server?)."""


def _header(headers: Any, name: str) -> str | None:
    """A header from httpx.Headers or a plain dict (LangChain copies headers into a dict, keys as sent)."""
    if headers is None:
        return None
    if isinstance(headers, Mapping):
        for k, v in headers.items():
            if str(k).lower() == name:
                return str(v)
        return None
    get = getattr(headers, "get", None)
    value = get(name) if callable(get) else None
    return None if value is None else str(value)


def _pick(ids: list[str], index: int, where: str) -> str:
    if not 0 <= index < len(ids):
        raise NoInteractionId(f"{where} holds {len(ids)} interaction ids; choice index {index} is not among them")
    return ids[index]


def _from_extension(obj: Any) -> list[str] | None:
    """`apprentice.interaction_ids` of a pydantic SDK object (kept as an extra field) or a JSON dict."""
    body = obj if isinstance(obj, Mapping) else (getattr(obj, "model_extra", None) or {})
    ext = body.get("apprentice") if isinstance(body, Mapping) else None
    if isinstance(ext, Mapping) and ext.get("interaction_ids"):
        return [str(x) for x in ext["interaction_ids"]]
    return None


def interaction_id_of(obj: Any, index: int = 0) -> str:
    """The interaction id of choice `index` of an answer, from whatever form the answer came in:
    a ChatCompletion, Completion, ChatCompletionChunk or Responses API `Response` (openai), a raw response
    (`with_raw_response`, or an httpx.Response), LangChain's AIMessage / AIMessageChunk (with
    `include_response_headers=True` for choices past the first), a JSON dict, or the id itself."""
    if isinstance(obj, str):
        return obj
    ids = _from_extension(obj)
    if ids:
        return _pick(ids, index, "the answer's apprentice extension")
    header = _header(getattr(obj, "headers", None), IDS_HEADER)
    if header is None:
        meta = getattr(obj, "response_metadata", None)       # LangChain messages
        if isinstance(meta, Mapping):
            header = _header(meta.get("headers"), IDS_HEADER)
            if header is None and index == 0 and meta.get("id"):
                return str(meta["id"])
    if header:
        return _pick(header.split(","), index, f"the {IDS_HEADER} header")
    if index == 0:
        got = obj.get("id") if isinstance(obj, Mapping) else getattr(obj, "id", None)
        # LangChain names messages it built itself `run-...` / `lc_run-...`: not the server's id
        if isinstance(got, str) and got and not got.startswith(("run-", "lc_run-")):
            return got
    raise NoInteractionId(f"{type(obj).__name__} carries no Apprentice interaction id for choice {index}; "
                          "for LangChain pass include_response_headers=True")


def session_id_of(obj: Any) -> str | None:
    """The session an answer belongs to, from the extension or the `x-apprentice-session-id` header."""
    from urllib.parse import unquote

    body = obj if isinstance(obj, Mapping) else (getattr(obj, "model_extra", None) or {})
    ext = body.get("apprentice") if isinstance(body, Mapping) else None
    if isinstance(ext, Mapping) and ext.get("session_id"):
        return str(ext["session_id"])
    headers = getattr(obj, "headers", None)
    meta = getattr(obj, "response_metadata", None)
    if headers is None and isinstance(meta, Mapping):
        headers = meta.get("headers")
    value = _header(headers, SESSION_HEADER)
    return None if value is None else unquote(value)


def feedback(via: Any, answer: Any, kind: str, value: float = 0.0, *, index: int = 0, comment: str = "",
             kpi_name: str = "", occurred_at: datetime | None = None, tenant: str = "",
             timeout: float | None = None) -> dict[str, Any]:
    """Send feedback (thumbs +1/-1, rating 1-5, correction with `comment`, kpi with `kpi_name`) about choice
    `index` of `answer` (anything `interaction_id_of` reads). `via` is an `InferenceClient` (gRPC Feedback
    service) or the `openai.OpenAI` client the answer came from (POST /v1/feedback, its key and base URL).
    Returns `{"event_id", "accepted"}` either way."""
    iid = interaction_id_of(answer, index)
    if hasattr(via, "_feedback") and callable(getattr(via, "feedback", None)):   # InferenceClient
        ack = via.feedback(iid, kind, value, comment=comment, kpi_name=kpi_name, occurred_at=occurred_at,
                           tenant=tenant, timeout=timeout)
        return {"event_id": ack.event_id, "accepted": ack.accepted}
    body: dict[str, Any] = {"interaction_id": iid, "kind": kind, "value": value}
    for k, v in (("comment", comment), ("kpi_name", kpi_name), ("tenant", tenant)):
        if v:
            body[k] = v
    if occurred_at is not None:
        when = occurred_at if occurred_at.tzinfo else occurred_at.replace(tzinfo=timezone.utc)
        body["occurred_at"] = when.isoformat()
    options: dict[str, Any] = {"timeout": timeout} if timeout is not None else {}
    got = via.post("/feedback", cast_to=object, body=body, options=options)
    if not isinstance(got, Mapping):
        raise TypeError(f"POST /feedback answered {type(got).__name__}, not a JSON object")
    return {"event_id": str(got.get("event_id", "")), "accepted": bool(got.get("accepted"))}
