"""LLM answer text --> candidate experience item texts. Never raises, whatever the model wrote.

Order of evidence:
1. lines carrying the marker "EXPERIENCE ITEM" (any case, bold, numbered, several on one line);
2. otherwise list lines ("- ...", "* ...", "1. ...", "(2) ...") that are not headings or template echoes;
3. otherwise nothing: free prose without structure is chatter, not an item.

Each piece is cleaned (markdown, quotes, numbering, placeholders) and kept only if it looks like a sentence:
enough letters, no control characters. Length and personal data are checked later by curation, which has
the limits from the settings.
"""

from __future__ import annotations

import re
import unicodedata

_MARKER = re.compile(r"\**\s*experience[\s_-]*items?\s*(?:#?\s*\d+)?\s*\**\s*[:：\-–]\s*\**", re.IGNORECASE)
_LIST = re.compile(r"^\s*(?:[-*•‣▪–]|\d{1,2}[.)]|\(\d{1,2}\)|[a-z][.)])\s+(.*)$")
# A heading: a markdown title, a short line ending in a colon, or a bare section word.
_HEADINGS = re.compile(r"^(?:#.*|[^.!?]{0,60}:|(?:additional\s+)?experiences?|rules?|strategies)\s*$", re.IGNORECASE)
_ECHO = re.compile(r"round\s*\d+_(?:input|output)|final result\s*:", re.IGNORECASE)
_THINK = re.compile(r"<think>.*?</think>", re.IGNORECASE | re.DOTALL)
_PLACEHOLDER = re.compile(r"^[\s.…<>\[\]()_\-*]*$")


def _strip_reasoning(text: str) -> str:
    text = _THINK.sub(" ", text)
    if "</think>" in text.lower():  # an unclosed reasoning block: keep what follows its end
        text = re.split(r"</think>", text, flags=re.IGNORECASE)[-1]
    return text


def clean_item(raw: str) -> str:
    """Markdown, quotes, numbering and whitespace off one candidate."""
    s = unicodedata.normalize("NFKC", raw)
    s = s.replace("**", "").replace("__", "").replace("`", "")
    s = re.sub(r"^\s*(?:[-*•‣▪–]|\d{1,2}[.)]|\(\d{1,2}\))\s*", "", s)
    s = re.sub(r"\s+", " ", s).strip()
    s = re.sub(r"[\s\-*•–]+$", "", s)   # a bullet left over from a following item on the same line
    s = s.strip(" \"'“”‘’")
    return s.strip()


def looks_like_text(s: str, *, min_letters: int = 8, min_letter_ratio: float = 0.6) -> bool:
    """A sentence rather than garbage: enough letters, mostly letters, no control/unassigned chars."""
    if not s or _PLACEHOLDER.match(s):
        return False
    if any(unicodedata.category(ch) in ("Cc", "Cf", "Cn", "Co", "Cs") for ch in s):
        return False
    visible = [ch for ch in s if not ch.isspace()]
    letters = sum(ch.isalpha() for ch in visible)
    if letters < min_letters or letters / max(1, len(visible)) < min_letter_ratio:
        return False
    return len(re.findall(r"[^\W\d_]{2,}", s)) >= 3   # at least three words


def _marker_pieces(lines: list[str]) -> list[str]:
    out: list[str] = []
    for line in lines:
        parts = _MARKER.split(line)
        if len(parts) > 1:
            out.extend(p for p in parts[1:])
    return out


def _list_pieces(lines: list[str]) -> list[str]:
    out: list[str] = []
    for line in lines:
        m = _LIST.match(line)
        if m and not _HEADINGS.match(m.group(1).strip()):
            out.append(m.group(1))
    return out


def parse_items(text: object, *, max_items: int | None = None) -> list[str]:
    """Candidate item texts in order of appearance, unique, at most `max_items`."""
    if not isinstance(text, str) or not text.strip():
        return []
    try:
        body = _strip_reasoning(text)
        lines = body.replace("\r", "\n").split("\n")
        pieces = _marker_pieces(lines) or _list_pieces(lines)
        out: list[str] = []
        seen: set[str] = set()
        for p in pieces:
            item = clean_item(p)
            if _ECHO.search(item) or _HEADINGS.match(item) or not looks_like_text(item):
                continue
            norm = item.lower()
            if norm in seen:
                continue
            seen.add(norm)
            out.append(item)
            if max_items is not None and len(out) >= max_items:
                break
        return out
    except Exception:  # noqa: BLE001 - a parser of model output must never take the service down
        return []
