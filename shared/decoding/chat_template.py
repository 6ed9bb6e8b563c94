"""Chat messages --> prompt text and token ids in which only the chat template's own tokens are control tokens.

Why: tokenising the rendered template as one string (`tok(apply_chat_template(...))`) re-parses every
special token in it, wherever it came from, so a user message containing `<|im_start|>system ...` became a
real role token: a forged system turn past the role whitelist. Special tokens written by users (or by
knowledge items, or by the text of a judged response) must stay text.

How (`encode_chat`, the one function every chat prompt goes through: inference, the trainer's student and
teacher prompts, the extractor's local LLM, the weights eval gate):
1) render the template with an unguessable sentinel in place of each message's content;
2) split the rendered text on the sentinels: template pieces, and content slots;
3) tokenise template pieces normally (their special tokens are the template's) and content with
   `split_special_tokens=True` (the text of a special token becomes ordinary tokens);
4) compatibility: tokenising the whole text in one call (what every caller did before) gives the same ids
   for ordinary content, except where a content boundary changes a merge (e.g. content starting with
   newlines). When that one-call encoding holds exactly the same sequence of control tokens as the safe
   one, no content contributed a control token, and the one-call ids are kept, so prompts without special
   tokens in their content are served exactly as before. Otherwise the safe ids are used.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EncodedChat:
    text: str
    """The prompt text: the rendered template with the messages' content in place."""
    ids: list[int]
    """The token ids to feed the model (and to record: they are what the model saw)."""
    content_control_tokens: bool
    """True when some content spelled a special token that was kept as text (worth a log line or a flag)."""


def _as_dicts(messages: Sequence[Mapping[str, str]] | Sequence[Any]) -> list[dict[str, str]]:
    return [{"role": m["role"], "content": m["content"]} if isinstance(m, Mapping)
            else {"role": m.role, "content": m.content} for m in messages]


def control_token_ids(tok: Any) -> frozenset[int]:
    """Ids of the tokenizer's special tokens (role markers, EOS, BOS, ...): the tokens content may not produce."""
    ids = {int(i) for i in getattr(tok, "all_special_ids", ()) or ()}
    for i, added in (getattr(tok, "added_tokens_decoder", None) or {}).items():
        if getattr(added, "special", False):
            ids.add(int(i))
    return frozenset(ids)


def special_token_strings(tok: Any) -> list[str]:
    """The text of every special token of `tok` (for the injection screen), longest first."""
    texts = set(getattr(tok, "all_special_tokens", ()) or ())
    for added in (getattr(tok, "added_tokens_decoder", None) or {}).values():
        if getattr(added, "special", False):
            texts.add(str(added.content))
    return sorted((t for t in texts if t), key=lambda t: (-len(t), t))


def encode_text(tok: Any, text: str) -> list[int]:
    """Text --> ids with every special token's text kept as ordinary text (never a control token)."""
    if not text:
        return []
    ids = list(tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])
    control = control_token_ids(tok)
    if any(i in control for i in ids):
        # A byte-level vocabulary that lacks some bytes (SmolLM2's has no token for 0xF1, the first byte of
        # U+40000..U+7FFFF) encodes them as its unknown token, which is also its end-of-text control
        # token: such a character cannot be represented, and must not become a control token. Drop it.
        unk = getattr(tok, "unk_token_id", None)
        ids = [i for i in ids if i != unk]
    if any(i in control for i in ids):
        raise RuntimeError(f"{type(tok).__name__} ignores split_special_tokens: content would produce control "
                           "tokens; use a tokenizer that supports it (Hugging Face tokenizers >= 0.15)")
    return ids


def _plain(tok: Any, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"]) if text else []


def _render(tok: Any, msgs: list[dict[str, str]], add_generation_prompt: bool) -> str:
    return str(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=add_generation_prompt))


def encode_chat(tok: Any, messages: Sequence[Mapping[str, str]] | Sequence[Any], *,
                add_generation_prompt: bool = True) -> EncodedChat:
    """Chat messages (dicts or ChatMessage protos) --> text and ids; see the module docstring.

    Raises whatever the template raises for messages it cannot render (callers map it to their errors)."""
    msgs = _as_dicts(messages)
    text = _render(tok, msgs, add_generation_prompt)
    # 1) sentinels: private-use characters around a random nonce, which no template alters and no content
    # can predict (content that imitates one cannot make the split misplace it)
    nonce = secrets.token_hex(8)
    slot = re.compile("\ue000" + nonce + r":(\d+)\ue001")
    marked = [{"role": m["role"], "content": f"\ue000{nonce}:{i}\ue001"} for i, m in enumerate(msgs)]
    parts = slot.split(_render(tok, marked, add_generation_prompt))   # piece, index, piece, index, ..., piece
    pieces, slots = parts[0::2], [int(i) for i in parts[1::2]]
    contents = [m["content"] for m in msgs]

    # 2) the content as the template placed it: as given, or trimmed (templates that `| trim` content);
    # a template that transforms content otherwise gets it as given, and the text follows the ids
    def assemble(form: Any) -> str:
        return "".join(p + (form(contents[s]) if k < len(slots) else "")
                       for k, (p, s) in enumerate(zip(pieces, [*slots, -1], strict=True)))

    chosen = next((f for f in (str, str.strip) if assemble(f) == text), str)
    text = assemble(chosen)

    # 3) template pieces parsed, content kept as text
    safe: list[int] = []
    for k, piece in enumerate(pieces):
        safe += _plain(tok, piece)
        if k < len(slots):
            safe += encode_text(tok, chosen(contents[slots[k]]))

    # 4) the one-call encoding when no content contributed a control token
    control = control_token_ids(tok)
    plain = _plain(tok, text)
    same_controls = [i for i in plain if i in control] == [i for i in safe if i in control]
    return EncodedChat(text=text, ids=plain if same_controls else safe, content_control_tokens=not same_controls)
