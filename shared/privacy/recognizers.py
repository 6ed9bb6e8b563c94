"""Apprentice's Presidio recognizers: where Presidio's own miss, or would reach the network.

- `CardRecognizer`: card numbers grouped by spaces, dots or dashes (Presidio's pattern knows no dots),
  Amex 4-6-5, 13-19 plain digits, digit by digit; kept only when `card_ok` (issuer prefix + Luhn) holds.
- `IbanRecognizer`: IBANs written in groups or as one word, any case; the span is exactly the country's
  IBAN length (so trailing words are not swallowed) and must pass ISO 13616 mod-97.
- `OfflineEmailRecognizer`: Presidio's e-mail pattern; the domain is checked against tldextract's
  bundled public-suffix snapshot (never a download) or reserved/private top-level names.
- `VersionAwareIpRecognizer`: Presidio's IPv4/IPv6 patterns, minus dotted quads that follow
  "version"/"v"/"build" (a four-part version string is a valid IPv4 address).
- `IntroducedNameRecognizer`: names people give for themselves ("my name is Dana Whitfield", "I'm Ana",
  "Thanks,\\nBob"), which a small NER model misses when the name is rare or the sentence short.
- `WindowedPhoneRecognizer`: Presidio's `PhoneRecognizer` (python-phonenumbers, region metadata) run on
  digit runs only, minus identifiers ("order 2023-004512"), plus `+<country> ...` numbers of a possible
  length that the metadata does not know as assigned.
Other names come from spaCy NER, with the filter `plausible_name` keeping NER's stray capitalised words out.
"""

from __future__ import annotations

import re
from typing import Any

import phonenumbers
import tldextract
from presidio_analyzer import (
    AnalysisExplanation,
    EntityRecognizer,
    LocalRecognizer,
    Pattern,
    PatternRecognizer,
    RecognizerResult,
)
from presidio_analyzer.predefined_recognizers import EmailRecognizer, IpRecognizer, PhoneRecognizer

from shared.privacy.checksums import IBAN_LENGTHS, card_ok, iban_ok
from shared.privacy.detector import CARD, EMAIL, IBAN, PERSON, PHONE, SESSION_ID


def _result(rec: LocalRecognizer, entity: str, start: int, end: int, score: float) -> RecognizerResult:
    """A result carrying what Presidio's analyzer expects of one (its context enhancer writes into the
    explanation)."""
    name = str(getattr(rec, "name", type(rec).__name__))
    return RecognizerResult(entity, start, end, score,
                            analysis_explanation=AnalysisExplanation(recognizer=name, original_score=score),
                            recognition_metadata={RecognizerResult.RECOGNIZER_NAME_KEY: name,
                                                  RecognizerResult.RECOGNIZER_IDENTIFIER_KEY: rec.id})


# --- cards -------------------------------------------------------------------------------------------
_SEP = r"[ .\-]"
_CARD_PATTERNS = [
    # 4-4-4-x (Visa, Mastercard, Discover, JCB, UnionPay: 13-19 digits), separators of any kinds mixed
    # ("4111-1111 1111.1111"): prefix + Luhn keep the precision, not the separators
    Pattern("card 4-4-4-x", rf"(?<![\d.\-])\d{{4}}{_SEP}?\d{{4}}{_SEP}?\d{{4}}{_SEP}?\d{{1,7}}(?![\d]|[.\-]\d)", 0.3),
    # read out digit by digit (voice transcripts, "4 1 1 1 ..."): 13-19 digits, one separator kind
    Pattern("card digit by digit", r"(?<![\d.\-])\d([ .\-])\d(?:\1\d){11,17}(?![\d]|[.\-]\d)", 0.3),
    # 4-6-5 (Amex) and 4-6-4 (Diners)
    Pattern("card 4-6-5", rf"(?<![\d.\-])\d{{4}}({_SEP})\d{{6}}\1\d{{4,5}}(?![\d]|[.\-]\d)", 0.3),
]


class CardRecognizer(PatternRecognizer):
    """Payment card numbers in any common grouping, validated with `card_ok` (prefix + Luhn)."""

    CONTEXT = ["card", "credit", "debit", "visa", "mastercard", "amex", "cc"]

    def __init__(self) -> None:
        super().__init__(supported_entity=CARD, patterns=list(_CARD_PATTERNS), context=self.CONTEXT,
                         name="ApprenticeCardRecognizer")

    def validate_result(self, pattern_text: str) -> bool:
        return card_ok(pattern_text)


# --- IBANs -------------------------------------------------------------------------------------------
# Country code + check digits, then alphanumerics in groups (of any size) split by one space, dash, dot or
# slash (mod-97 and the country's length keep the precision).
_IBAN_START = re.compile(r"(?<![A-Za-z0-9])([A-Za-z]{2})(\d{2})(?=[ \-./]?[A-Za-z0-9])")


class IbanRecognizer(LocalRecognizer):
    """IBANs: from each `CC99` start, take exactly the country's length of characters (separators
    skipped); a span that ends inside a word, or fails mod-97, is not an IBAN."""

    def __init__(self) -> None:
        super().__init__(supported_entities=[IBAN], name="ApprenticeIbanRecognizer",
                         context=["iban", "bank", "transfer", "account", "wire"])

    def load(self) -> None:
        pass

    def analyze(self, text: str, entities: list[str], nlp_artifacts: Any = None) -> list[RecognizerResult]:
        out: list[RecognizerResult] = []
        for m in _IBAN_START.finditer(text):
            want = IBAN_LENGTHS.get(m.group(1).upper())
            if want is None:
                continue
            i, n, prev_sep = m.start(), 0, False
            while i < len(text) and n < want:
                c = text[i]
                if c.isascii() and c.isalnum():
                    n, prev_sep = n + 1, False
                elif c in " -./" and not prev_sep and n >= 4:     # "DE89.3704...", "FR14/2004/..."
                    prev_sep = True
                else:
                    break
                i += 1
            if n != want or (i < len(text) and text[i].isascii() and text[i].isalnum()):
                continue
            if iban_ok(text[m.start():i]):
                out.append(_result(self, IBAN, m.start(), i, 1.0))
        return out


# --- e-mail ------------------------------------------------------------------------------------------
# The public-suffix list bundled with tldextract; suffix_list_urls=() means it never fetches one.
_TLD = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)
# Reserved (RFC 2606/6761) and common private top-level names: mailboxes there are still someone's.
_PRIVATE_TLDS = frozenset({"example", "test", "invalid", "localhost", "local", "internal", "corp", "lan",
                           "home", "intranet", "private"})


class OfflineEmailRecognizer(EmailRecognizer):
    """Presidio's e-mail pattern; the domain must end in a known public suffix (bundled list, so
    `icon@2x.png` is not an address) or a reserved/private top-level name (`alice@corp.internal` is)."""

    def __init__(self) -> None:
        super().__init__(name="ApprenticeEmailRecognizer")

    def validate_result(self, pattern_text: str) -> bool:
        domain = pattern_text.rsplit("@", 1)[-1].lower()
        return domain.rsplit(".", 1)[-1] in _PRIVATE_TLDS or bool(_TLD(domain).suffix)


# Spelled-out addresses: "jane dot doe at example dot com", "jane(at)example(dot)com", "jane [at] x [dot] org",
# "omar AT gmail DOT com", "sven@lindqvist dot se". A bracketed or upper-case at/dot, or a real "@", is a
# disguise on its own; a plain lower-case " at " only when the part before it has the punctuation of an
# address (".", "_", "+", a digit or a spelled dot), so "look at example dot com" stays prose.
_BR_AT = r"\s*[(\[{<]\s*at\s*[)\]}>]\s*"
_BR_DOT = r"\s*[(\[{<]\s*dot\s*[)\]}>]\s*"
_DOT = rf"(?:\.|{_BR_DOT}|\s+(?:dot|DOT)\s+)"
_AT = rf"(?:\s*@\s*|{_BR_AT}|\s+(?:at|AT)\s+)"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9_+\-]{0,62})"
_SPELLED_EMAIL = re.compile(rf"(?<![\w.@+\-])(?P<local>{_LABEL}(?:{_DOT}{_LABEL}){{0,4}})(?P<at>{_AT})"
                            rf"(?P<domain>{_LABEL}(?:{_DOT}{_LABEL}){{1,4}})(?![\w@]|\.\w)", re.IGNORECASE)
_SPELLED_TOKEN = re.compile(rf"{_BR_AT}|{_BR_DOT}|\s+(?:at|dot)\s+", re.IGNORECASE)


class SpelledEmailRecognizer(LocalRecognizer):
    """E-mail addresses with "at"/"dot" spelled out or bracketed; the address they spell must pass the
    e-mail recognizer's domain check (a public suffix or a private top-level name)."""

    def __init__(self) -> None:
        super().__init__(supported_entities=[EMAIL], name="ApprenticeSpelledEmailRecognizer")

    def load(self) -> None:
        pass

    def analyze(self, text: str, entities: list[str], nlp_artifacts: Any = None) -> list[RecognizerResult]:
        out: list[RecognizerResult] = []
        for m in _SPELLED_EMAIL.finditer(text):
            if not _SPELLED_TOKEN.search(m.group(0)) and "@" in m.group("at"):
                continue                            # a plain address: the e-mail recognizer's
            at = m.group("at")
            plain_at = "@" not in at and not re.search(r"[(\[{<]", at) and not at.strip().isupper()
            local = m.group("local")
            if plain_at and not (re.search(r"[._+\d]", local) or _SPELLED_TOKEN.search(local)):
                continue
            domain = _SPELLED_TOKEN.sub(".", m.group("domain")).lower()
            if domain.rsplit(".", 1)[-1] in _PRIVATE_TLDS or _TLD(domain).suffix:
                out.append(_result(self, EMAIL, m.start(), m.end(), 0.9))
        return out


# --- session and account ids ---------------------------------------------------------------------
# A token of 16+ letters, digits, "_" and "-" (a UUID, a hex or base62 id, "cus_..."), with both letters and
# digits, that the words before it name a session, account, user, customer or device id/token. A bare UUID
# (a request id, a trace id) or an order number is not tied to a person and stays.
_NAMED_ID = re.compile(r"\b(?:session|account|acct|user|customer|client|device|member)[ _\-]?"
                       r"(?:id|token|key|number|no)?\b\s*(?:is|=|:|#)?\s*"
                       r"(?P<id>[A-Za-z0-9_\-]{16,128})(?![\w\-])", re.IGNORECASE)


class SessionIdRecognizer(LocalRecognizer):
    """Session, account and user ids (`SESSION_ID`): they tie a captured conversation to one person."""

    def __init__(self) -> None:
        super().__init__(supported_entities=[SESSION_ID], name="ApprenticeSessionIdRecognizer")

    def load(self) -> None:
        pass

    def analyze(self, text: str, entities: list[str], nlp_artifacts: Any = None) -> list[RecognizerResult]:
        out: list[RecognizerResult] = []
        for m in _NAMED_ID.finditer(text):
            tok = m.group("id")
            if re.search(r"[A-Za-z]", tok) and re.search(r"\d", tok):
                out.append(_result(self, SESSION_ID, m.start("id"), m.end("id"), 0.8))
        return out


# --- IP addresses ------------------------------------------------------------------------------------
_VERSION_BEFORE = re.compile(r"(?:\bv|\bver|\bversion|\bbuild|\brelease|\brev|\bfirmware)\.?\s*[:#]?\s*$",
                             re.IGNORECASE)


class VersionAwareIpRecognizer(IpRecognizer):
    """Presidio's IP patterns and checks, minus dotted quads introduced as a version number."""

    def __init__(self) -> None:
        super().__init__(name="ApprenticeIpRecognizer")

    def analyze(self, text: str, entities: list[str], nlp_artifacts: Any = None,
                regex_flags: int | None = None) -> list[RecognizerResult]:
        results = super().analyze(text, entities, nlp_artifacts, regex_flags)
        return [r for r in results if not _VERSION_BEFORE.search(text[max(0, r.start - 24):r.start])]


# --- phone numbers -----------------------------------------------------------------------------------
# A run that could hold a phone number: optional +/( then digits with separators, 7+ digits in all.
_PHONE_RUN = re.compile(r"(?:\+|\(\+?)?\d(?:[\d \t().\-/]{0,3}\d){6,}\)?")
# Digit runs introduced as one of these are identifiers, not phone numbers (python-phonenumbers accepts
# many 8-12 digit strings as a valid number of some region).
_ID_BEFORE = re.compile(r"(?:\b(?:order|invoice|inv|batch|lot|serial|sn|s/n|ref|reference|ticket|tracking|sku|"
                        r"part|isbn|id|code|case|claim|account no|acct|transaction|txn|po|model|version|build)"
                        r"\b[^\w\n]{0,3}(?:number|no|nr|#)?[^\w\n]{0,3}|[\w/\-])$", re.IGNORECASE)


class WindowedPhoneRecognizer(PhoneRecognizer):
    """Presidio's phonenumbers-based recognizer, run only over the digit runs of the text (with a few
    characters around them) instead of the whole text once per region: text without seven digits in a
    row costs nothing. A run glued to a word ("INV-2023-004512") or introduced as an order, serial,
    ticket... number is not a phone number."""

    def __init__(self, regions: tuple[str, ...], leniency: int = 1) -> None:
        super().__init__(supported_regions=regions, leniency=leniency, name="ApprenticePhoneRecognizer")
        self._leniency = leniency      # python-phonenumbers: 1 = VALID (a number of an assigned range)

    def analyze(self, text: str, entities: list[str], nlp_artifacts: Any = None) -> list[RecognizerResult]:
        out: list[RecognizerResult] = []
        for m in _PHONE_RUN.finditer(text):
            if _ID_BEFORE.search(text[max(0, m.start() - 30):m.start()]):
                continue
            lo, hi = max(0, m.start() - 3), min(len(text), m.end() + 3)
            found = self._match(text[lo:hi], international=m.group(0).startswith("+"))
            for r in found:
                r.start += lo
                r.end += lo
            if not found and m.group(0).startswith("+"):
                found = self._international(text, m.start(), m.end())
            out.extend(found)
        return out

    def _match(self, window: str, international: bool) -> list[RecognizerResult]:
        """Presidio's PhoneRecognizer loop over regions; a `+` number parses the same in every region, so
        one pass is enough for it."""
        results = []
        for region in self.supported_regions[:1] if international else self.supported_regions:
            for match in phonenumbers.PhoneNumberMatcher(window, region, leniency=self._leniency):
                results.append(self._get_recognizer_result(match, window, region, None))
        return list(EntityRecognizer.remove_duplicates(results))

    def _international(self, text: str, start: int, end: int) -> list[RecognizerResult]:
        """`+<country code> <digits>` of a length that country's numbers have: a phone number even where
        the region metadata knows the range as unassigned (new mobile ranges, reserved test ranges)."""
        run = text[start:end].rstrip(" ().-/")
        try:
            number = phonenumbers.parse(run, None)
        except phonenumbers.NumberParseException:
            return []
        if not phonenumbers.is_possible_number(number):
            return []
        return [_result(self, PHONE, start, start + len(run), self.SCORE)]


# --- names -------------------------------------------------------------------------------------------
# Capitalised words after "I am"/"this is"/sign-offs that are not names, and words NER tags as PERSON
# in support chat that are not names either.
NOT_NAMES = frozenset({
    "a", "an", "the", "not", "sorry", "looking", "trying", "going", "having", "here", "new", "just", "still",
    "so", "very", "really", "fine", "good", "happy", "sure", "unable", "confused", "interested", "writing",
    "calling", "asking", "wondering", "getting", "using", "on", "in", "at", "from", "with", "your", "my",
    "it", "that", "what", "why", "how", "urgent", "important", "done", "back", "ok", "okay", "customer",
    "user", "support", "team", "admin", "manager", "english", "correct", "wrong", "right", "great", "hi",
    "hello", "hey", "dear", "thanks", "thank", "regards", "cheers", "best", "sincerely", "mr", "mrs", "ms",
    "dr", "sir", "madam", "assistant", "bot", "agent", "please", "yes", "no", "glad", "afraid", "also",
    "now", "currently", "available", "able", "travelling", "traveling", "moving", "there",
})
_WORD = r"[^\W\d_](?:[^\W\d_]|['\u2019\-]){1,30}"
_NAME = rf"({_WORD}(?:\s+{_WORD}){{0,2}})"
_INTRO = re.compile(r"\b(?:my name is|my name's|name\s*:|i am|i'm|this is|call me|it's|signed)\s+" + _NAME,
                    re.IGNORECASE)
_SIGNOFF = re.compile(r"(?:thanks|thank you|regards|cheers|best|sincerely|br)[,!.]?[ \t]*(?:\n|-{1,2}|,)[ \t]*"
                      + _NAME + r"[ \t]*(?:\n|$)", re.IGNORECASE)
_NAME_WORD = re.compile(r"^[^\W\d_](?:[^\W\d_]|['\u2019\-.])*$")


def plausible_name(span_text: str) -> bool:
    """A PERSON span reads as a name: capitalised words of letters, at least one of them not a
    greeting or a common word. Keeps NER's false positives on chat boilerplate and gibberish out."""
    words = span_text.split()
    if not 1 <= len(words) <= 4 or not all(_NAME_WORD.match(w) and w[0].isupper() for w in words):
        return False
    return any(w.strip(".'\u2019-").lower() not in NOT_NAMES for w in words)


class IntroducedNameRecognizer(LocalRecognizer):
    """Names given in an introduction or a sign-off; the intro word fixes the case-insensitive match, the
    name itself must be capitalised (so "I am looking" is not a name)."""

    def __init__(self) -> None:
        super().__init__(supported_entities=[PERSON], name="ApprenticeIntroducedNameRecognizer")

    def load(self) -> None:
        pass

    def analyze(self, text: str, entities: list[str], nlp_artifacts: Any = None) -> list[RecognizerResult]:
        out: list[RecognizerResult] = []
        for rx in (_INTRO, _SIGNOFF):
            for m in rx.finditer(text):
                words = list(re.finditer(r"\S+", m.group(1)))
                # keep the leading run of name words: "Dana Whitfield Looking" -> "Dana Whitfield"
                keep = 0
                for w in words:
                    if not w.group(0)[0].isupper() or w.group(0).strip("'\u2019-").lower() in NOT_NAMES:
                        break
                    keep += 1
                if keep == 0:
                    continue
                start, end = m.start(1), m.start(1) + words[keep - 1].end()
                out.append(_result(self, PERSON, start, end, 0.85))
        return out
