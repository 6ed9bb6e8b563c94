"""Item text (+ the trajectory's user messages) --> the kinds of personal data it contains.

Knowledge is shared by every conversation of a tenant and reaches training, so an item that carries one
user's email, phone, card number or name is rejected outright (not redacted: a redacted fact is rarely a
useful rule). Detection is conservative: a false rejection costs one item, a leak costs much more.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

EMAIL = re.compile(r"[A-Za-z0-9._%+\-]+@[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)*\.[A-Za-z]{2,}")
# 13-19 digits, optionally grouped by spaces or dashes (card numbers); checked with Luhn.
CARD = re.compile(r"(?<![\d])(?:\d[ \-]?){12,18}\d(?![\d])")
# 7-15 digits with optional +country, brackets, spaces, dots or dashes between them.
PHONE = re.compile(r"(?<![\w])(?:\+|00)?\(?\d[\d\s().\-]{5,18}\d(?![\w])")
SSN = re.compile(r"(?<!\d)\d{3}-\d{2}-\d{4}(?!\d)")
_DATE = re.compile(r"^\d{4}[-./]\d{1,2}[-./]\d{1,2}$|^\d{1,2}[-./]\d{1,2}[-./]\d{4}$")
IBAN = re.compile(r"\b[A-Z]{2}\d{2}(?:\s?[A-Z0-9]{4}){3,7}\b")

# How users introduce themselves or sign off; the captured words are names to keep out of items.
_NAME = r"([A-Z][a-zA-Z'\-]{1,30}(?:\s+[A-Z][a-zA-Z'\-]{1,30})?)"
_INTRO = re.compile(r"\b(?:my name is|my name's|i am|i'm|this is|call me|name\s*:)\s+" + _NAME, re.IGNORECASE)
_SIGNOFF = re.compile(r"(?:thanks|thank you|regards|cheers|best|sincerely|br)[,!.]?\s*(?:\n|-{1,2}|,)\s*" + _NAME + r"\s*$",
                      re.IGNORECASE)
# Capitalised words after "I am"/"this is" that are not names.
_NOT_NAMES = {
    "a", "an", "the", "not", "sorry", "looking", "trying", "going", "having", "here", "new", "just", "still",
    "so", "very", "really", "fine", "good", "happy", "sure", "unable", "confused", "interested", "writing",
    "calling", "asking", "wondering", "getting", "using", "on", "in", "at", "from", "with", "your", "my",
    "it", "that", "what", "why", "how", "urgent", "important", "done", "back", "ok", "okay", "customer",
    "user", "support", "team", "admin", "manager", "english", "correct", "wrong", "right", "great",
}


def _digits(s: str) -> str:
    return re.sub(r"\D", "", s)


def luhn_ok(number: str) -> bool:
    """The Luhn checksum every payment card number satisfies."""
    ds = [int(c) for c in _digits(number)]
    if len(ds) < 13:
        return False
    total = 0
    for i, d in enumerate(reversed(ds)):
        if i % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def names_from_user_texts(texts: Iterable[str]) -> set[str]:
    """Names users gave for themselves ("my name is Ana Lima", "Thanks, Bob"), as single words."""
    names: set[str] = set()
    for text in texts:
        for rx in (_INTRO, _SIGNOFF):
            for m in rx.finditer(text or ""):
                for word in m.group(1).split():
                    w = word.strip("'-")
                    if len(w) >= 2 and w.lower() not in _NOT_NAMES and w[0].isupper():
                        names.add(w)
    return names


def find_pii(text: str, names: Iterable[str] = ()) -> list[str]:
    """The kinds of personal data in `text`: email, card, phone, ssn, iban, name:<word>."""
    found: list[str] = []
    if EMAIL.search(text):
        found.append("email")
    if any(luhn_ok(m.group(0)) for m in CARD.finditer(text)):
        found.append("card")
    if SSN.search(text):
        found.append("ssn")
    for m in PHONE.finditer(text):
        token = m.group(0).strip()
        if _DATE.match(token):
            continue
        if 7 <= len(_digits(token)) <= 15 and "phone" not in found:
            found.append("phone")
    if IBAN.search(text):
        found.append("iban")
    for name in names:  # case-sensitive: "Will" the name, not "will" the verb
        if re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", text):
            found.append(f"name:{name}")
    return found
