"""Generated token ids --> the text a caller sees: end-of-sequence ids, stop strings, what may stream."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def eos_ids_of(model: Any, tok: Any) -> set[int]:
    """Every id that ends a sequence: the generation config's, the model config's and the tokenizer's
    (chat models often list several, e.g. `<|im_end|>` next to `<|endoftext|>`)."""
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), model.config):
        e = getattr(src, "eos_token_id", None) if src is not None else None
        if isinstance(e, int):
            ids.add(e)
        elif isinstance(e, list | tuple):
            ids.update(int(x) for x in e)
    if tok.eos_token_id is not None:
        ids.add(int(tok.eos_token_id))
    return ids


def first_stop(text: str, stops: Sequence[str]) -> int:
    """Index of the earliest occurrence of any stop string in `text`, or -1."""
    cut = -1
    for s in stops:
        i = text.find(s)
        if i >= 0 and (cut < 0 or i < cut):
            cut = i
    return cut


def stream_safe_length(text: str, stops: Sequence[str]) -> int:
    """How much of `text` may be streamed now: hold back an unfinished UTF-8 character (decoded as
    U+FFFD) and any suffix that could still grow into a stop string (which would then be cut)."""
    end = len(text)
    while end > 0 and text[end - 1] == "\ufffd":
        end -= 1
    for s in stops:
        for k in range(min(len(s) - 1, end), 0, -1):
            if text[:end].endswith(s[:k]):
                end -= k
                break
    return max(end, 0)
