"""Item text (+ what users wrote in the trajectory) --> the kinds of personal data the item contains.

Knowledge is shared by every conversation of a tenant and reaches training, so an item that carries one
user's e-mail, phone, card number, IBAN, IP address or name is rejected outright (not redacted: a
redacted fact is rarely a useful rule). Detection is the shared detector (`shared.privacy`: Presidio, spaCy
NER, card and IBAN checksums), the one inference capture redacts with. Names users gave anywhere in the
trajectory (messages and corrections) are also matched word by word, because an item may use a name
where NER does not read one ("Dana prefers refunds by bank transfer").

The tenant's declared public business data (`APPRENTICE_BUSINESS_NAMES`, `APPRENTICE_BUSINESS_DATA`,
`shared.privacy.business`) is not personal data: a name NER finds that is only one of its names, or a phone
number or e-mail address that is only its declared one, neither rejects the item nor counts as a user's name,
and a user's name word inside an occurrence of a declared value ("Dana" of a user "Dana Smith" in "Dana
Whitfield approves returns") is not that user. So "Dana Whitfield at our returns desk approves refunds" and
"Call customer service on 0800 414 2277" can be learned while "Dana prefers refunds by bank transfer" and an
item with a user's own number cannot.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from shared.privacy import get_detector
from shared.privacy.business import NO_DATA, BusinessData
from shared.privacy.checksums import luhn_ok
from shared.privacy.detector import CARD, EMAIL, IBAN, IP, PERSON, PHONE, SSN
from shared.privacy.recognizers import NOT_NAMES

__all__ = ["KINDS", "find_pii", "luhn_ok", "names_from_user_texts"]

KINDS = {EMAIL: "email", CARD: "card", PHONE: "phone", SSN: "ssn", IBAN: "iban", IP: "ip", PERSON: "name"}
"""Detector entity type --> the kind named in a rejection reason ("personal data: card, email")."""


def names_from_user_texts(texts: Iterable[str], business: BusinessData = NO_DATA) -> set[str]:
    """Names in what users wrote ("my name is Ana Lima", "Thanks,\\nBob", NER), as single words; not the
    tenant's declared `business` data (a correction naming the staff member who decided is no user's name)."""
    detector = get_detector()
    names: set[str] = set()
    for text in texts:
        if not text:
            continue
        for span in business.keep(text, detector.find(text)):
            if span.entity != PERSON:
                continue
            for word in text[span.start:span.end].split():
                w = word.strip(".'\u2019-")
                if len(w) >= 2 and w[0].isupper() and w.lower() not in NOT_NAMES:
                    names.add(w)
    return names


def find_pii(text: str, names: Iterable[str] = (), business: BusinessData = NO_DATA) -> list[str]:
    """The kinds of personal data in `text` (email, card, phone, ssn, iban, ip, name), plus `name:<word>`
    for each of `names` it contains (case-sensitive: "Will" the name, not "will" the verb) outside the
    tenant's declared `business` data (its names, phones, e-mail, web and street addresses)."""
    found: list[str] = []
    for span in business.keep(text, get_detector().find(text)):
        kind = KINDS.get(span.entity, span.entity.lower())
        if kind not in found:
            found.append(kind)
    occurrences = business.occurrences(text)
    for name in names:
        if any(not business.covers(text, m.start(), m.end(), occurrences)
               for m in re.finditer(rf"(?<![\w]){re.escape(name)}(?![\w])", text)):
            found.append(f"name:{name}")
    return found
