"""A tenant's own public business data (its names, phone numbers, e-mail addresses, street addresses and web
addresses) --> kept by redaction, exactly those values and only for that tenant.

Why: a backend's corrections and the model's answers name the business and say how to reach it ("This is
Trailmate support", "Dana Whitfield at our returns desk approves it", "Call customer service on 0800 414
2277", "Write to found@trailmate.co.uk about lost property"). NER reads the names as people and the
recognizers read the numbers and addresses as someone's, so without this every such fact would reach the
topics as "<PERSON> approves it" or "call <PHONE_NUMBER>" and could never be learned: a support desk could not
teach its own phone number. The tenant declares its public data (`APPRENTICE_BUSINESS_NAMES` and
`APPRENTICE_BUSINESS_DATA`, shared/settings.py; a task file's `business_names:` and `business_data:`), and
`BusinessData.keep` drops the detections that are only those values.

Kinds (`KINDS`) and what an occurrence of a declared value exempts:
- `names` (products, places, staff who speak for it): only a detected *name* (PERSON) that lies entirely
  inside occurrences of declared values (case-insensitive, whole words), or inside declared names written
  next to each other that NER read as one span (a sign-off "Dana Whitfield\\nTrailmate"). An end user who
  merely shares a word with a staff member ("Dana Smith" vs declared "Dana Whitfield") is a span with a word
  outside every occurrence, so it is still redacted, whole. A declared *name* never exempts an e-mail, phone,
  card, IBAN, IP or SSN, even one that contains it (dana.whitfield@trailmate.com): those reach a person or an
  account by themselves.
- `phones`: the number, compared on its digits (any spaces, dots, dashes, slashes or brackets between them);
  a number declared in international form ("+44 800 414 2277") is also found written nationally ("0800 414
  2277", "(0800) 414-2277"), with "00" for "+", or with the trunk digit in brackets ("+44 (0)800 ...").
  A number declared in national form is found in national form only (which country it belongs to is not
  known): declare the international form to keep both. Never a number with more digits on either side.
- `emails`: the address, any case, never as part of a longer address ("lost.found@..." or "found@...co.uk.evil").
- `urls`: the web address with or without "http(s)://" and "www.", any case, a trailing "/" optional.
- `addresses` (street addresses): their words in order, any case, separated by any spacing and light
  punctuation ("12 Harbour Road, Leith" = "12 harbour road\\nLeith"), whole words.
A detection of *any* type that lies entirely inside occurrences of declared phones, e-mails, web addresses or
street addresses is exempt: every letter and digit of it is the business's declared text (a PERSON that NER
reads in "Dana Point" of a declared street address; the PHONE_NUMBER of a declared phone). A detection that
reaches one character beyond them (a user's longer number, an address with more words) is redacted whole.

Values are matched literally (never as patterns) and only ever remove detections: a declared value cannot make
anything else be kept, so the bounds below are about cost and typos, not about safety. A user's phone number or
e-mail address that the tenant did not declare stays redacted, and so does everything in another tenant's
text: tenant A's declaration never exempts text captured for tenant B (callers pass the tenant's own
`BusinessData`; `Redactor` keys its cache by it).
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence

from shared.privacy.detector import PERSON, Span, detection_view

NAMES, PHONES, EMAILS, ADDRESSES, URLS = "names", "phones", "emails", "addresses", "urls"
KINDS: tuple[str, ...] = (NAMES, PHONES, EMAILS, ADDRESSES, URLS)
"""The kinds of public business data a tenant declares (the keys of `APPRENTICE_BUSINESS_DATA`'s objects and of
a task file's `business_data:`)."""

NAME_EXEMPTIBLE: frozenset[str] = frozenset({PERSON})
"""Types a declared *name* may exempt. Structured identifiers (e-mail, phone, card, IBAN, IP, SSN) identify a
person or an account whatever words they contain; only a declared phone, e-mail, web or street address exempts
them, and only where the detection is that declared text."""

MAX_VALUES_PER_KIND = 256
"""Declared values of one kind per tenant: a business has products, places, spokespeople, a few numbers and
addresses, not a directory; each value is one more alternative in the pattern matched against every text."""
MAX_NAMES_PER_TENANT = MAX_VALUES_PER_KIND

MAX_NAME_CHARS = 100
"""Longest name (a product line or a full name with a title fits; a sentence does not)."""

MAX_VALUE_CHARS = 200
"""Longest street address or web address."""

MAX_TENANTS = 10_000
"""Tenants in one mapping (bounds what one environment variable makes every process compile)."""

MIN_PHONE_DIGITS, MAX_PHONE_DIGITS = 6, 15
"""Digits of a declared phone number (E.164 allows 15; fewer than 6 is an extension or a short code)."""

_PATTERN_CHARS = set("*?\\|^$[]{}()<>")
"""Characters that would make a name read as a wildcard, a regular expression or a redaction placeholder."""
_URL_REFUSED = set("*\\|^[]{}<>\"'`")
_EMAIL = re.compile(r"[^\s@<>()\[\]\\,;:\"*]+@[^\s@<>()\[\]\\,;:\"*]+\.[A-Za-z0-9\-]{2,}")
_URL = re.compile(r"(?:https?://)?[A-Za-z0-9](?:[A-Za-z0-9\-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9\-]+)*\.[A-Za-z]{2,}"
                  r"(?::\d{1,5})?(?:[/?#]\S*)?", re.IGNORECASE)
_PHONE_CHARS = re.compile(r"\+?[\d\s.\-/()]+")


# --- validation: one value of each kind ------------------------------------------------------------
def _common(value: object, kind: str, max_chars: int) -> str:
    if not isinstance(value, str):
        raise ValueError(f"a {kind} must be a string, got {type(value).__name__}")
    clean = " ".join(value.split())
    if not clean:
        raise ValueError(f"a {kind} may not be empty")
    if len(clean) > max_chars:
        raise ValueError(f"{kind} {clean[:40]!r}... is longer than {max_chars} characters")
    if any(not c.isprintable() for c in clean):
        raise ValueError(f"{kind} {clean!r} contains a control character")
    return clean


def clean_name(name: object) -> str:
    """`name` with its whitespace collapsed; raises ValueError saying why it cannot be a business name."""
    clean = _common(name, "name", MAX_NAME_CHARS)
    if bad := sorted(set(clean) & _PATTERN_CHARS):
        raise ValueError(f"name {clean!r} contains {''.join(bad)!r}: names are matched literally, as whole "
                         "words; write each name out instead of a pattern")
    if not any(c.isalpha() for c in clean):
        raise ValueError(f"name {clean!r} has no letter: a name is words, not a pattern or a number")
    if len(clean) < 2:
        raise ValueError(f"name {clean!r} is shorter than 2 characters")
    return clean


def clean_phone(phone: object) -> str:
    """A phone number as written (whitespace collapsed): digits, an optional leading "+", and spaces, dots,
    dashes, slashes or brackets between them; 6-15 digits (after a "+" or "00")."""
    clean = _common(phone, "phone number", 40)
    if not _PHONE_CHARS.fullmatch(clean):
        raise ValueError(f"phone number {clean!r} may hold only digits, a leading '+', and spaces, dots, dashes, "
                         "slashes or brackets (write an extension or a name elsewhere)")
    intl, digits = _phone_digits(clean)
    if not MIN_PHONE_DIGITS <= len(digits) <= MAX_PHONE_DIGITS:
        raise ValueError(f"phone number {clean!r} has {len(digits)} digits; a number has "
                         f"{MIN_PHONE_DIGITS}-{MAX_PHONE_DIGITS}" + (" after its '+' or '00'" if intl else ""))
    return clean


def clean_email(email: object) -> str:
    """An e-mail address, written out (no wildcards: `*@acme.com` is refused)."""
    clean = _common(email, "e-mail address", 254)
    if not _EMAIL.fullmatch(clean):
        raise ValueError(f"e-mail address {clean!r} is not one address like name@example.com (no spaces, "
                         "wildcards or lists)")
    return clean


def clean_url(url: object) -> str:
    """A web address ("https://www.trailmate.com/returns", "trailmate.com"): a host name with a dot, an
    optional http(s) scheme, port and path; no spaces or wildcards."""
    clean = _common(url, "web address", MAX_VALUE_CHARS)
    if " " in clean or (bad := sorted(set(clean) & _URL_REFUSED)):
        raise ValueError(f"web address {clean!r} contains "
                         f"{' ' if ' ' in clean else ''.join(bad)!r}: write each address out, literally")
    if not _URL.fullmatch(clean):
        raise ValueError(f"web address {clean!r} is not a host name with a dot, with an optional "
                         "http(s):// and path (trailmate.com/returns)")
    return clean


def clean_address(address: object) -> str:
    """A street address ("12 Harbour Road, Leith, Edinburgh EH6 6LX"): at least two words, one letter."""
    clean = _common(address, "street address", MAX_VALUE_CHARS)
    if bad := sorted(set(clean) & _PATTERN_CHARS):
        raise ValueError(f"street address {clean!r} contains {''.join(bad)!r}: addresses are matched literally, "
                         "word by word")
    if not any(c.isalpha() for c in clean) or len(re.findall(r"\w+", clean)) < 2:
        raise ValueError(f"street address {clean!r} needs at least two words and a letter (a single place "
                         "name is a name)")
    return clean


def _phone_digits(phone: str) -> tuple[bool, str]:
    """(international, the digits after "+"/"00" or all of them)."""
    digits = "".join(str(int(c)) for c in phone if c.isdecimal())     # any script's digits, as ASCII
    if phone.lstrip().startswith("+"):
        return True, digits
    if digits.startswith("00"):
        return True, digits[2:]
    return False, digits


def _url_canonical(url: str) -> str:
    """"HTTPS://www.Trailmate.com/returns/" --> "trailmate.com/returns"."""
    bare = re.sub(r"^https?://", "", url, flags=re.IGNORECASE)
    bare = re.sub(r"^www\.", "", bare, flags=re.IGNORECASE)
    return bare.rstrip("/").lower()


CLEANERS: dict[str, Callable[[object], str]] = {NAMES: clean_name, PHONES: clean_phone, EMAILS: clean_email,
                                                ADDRESSES: clean_address, URLS: clean_url}


def normalised(kind: str, value: str) -> str:
    """What two declared values of `kind` are compared by (duplicates, the cache key): case, and for phone
    numbers everything but the digits (and whether it is international)."""
    if kind == PHONES:
        intl, digits = _phone_digits(value)
        return ("+" if intl else "") + digits
    if kind == URLS:
        return _url_canonical(value)
    if kind == ADDRESSES:
        return " ".join(re.findall(r"\w+", value.casefold()))
    return value.casefold()


def clean_values(kind: str, values: Iterable[object]) -> tuple[str, ...]:
    """Validated values of `kind`, duplicates (as `normalised`) dropped, in the order given; raises ValueError
    naming the bad entry or the count."""
    if kind not in CLEANERS:
        raise ValueError(f"unknown kind {kind!r}; one of {', '.join(KINDS)}")
    noun = kind.rstrip("s") if kind != ADDRESSES else "address"
    if isinstance(values, str) or not isinstance(values, Iterable):
        raise ValueError(f"{kind} must be a list of strings, not one string")
    out: dict[str, str] = {}
    for n, value in enumerate(values, start=1):
        try:
            clean = CLEANERS[kind](value)
        except ValueError as e:
            raise ValueError(f"{noun} {n}: {e}") from None
        out.setdefault(normalised(kind, clean), clean)
    if len(out) > MAX_VALUES_PER_KIND:
        raise ValueError(f"{len(out)} {kind}; at most {MAX_VALUES_PER_KIND} per tenant")
    return tuple(out.values())


def clean_names(names: Iterable[object]) -> tuple[str, ...]:
    """Validated names, duplicates (ignoring case) dropped, in the order given."""
    return clean_values(NAMES, names)


def clean_declaration(declaration: object) -> dict[str, tuple[str, ...]]:
    """One tenant's `{kind: [values]}` --> validated values per kind (kinds with none left out); raises
    ValueError naming an unknown kind or the bad entry."""
    if not isinstance(declaration, Mapping):
        raise ValueError(f"expected an object {{{': [...], '.join(KINDS)}: [...]}}")
    out: dict[str, tuple[str, ...]] = {}
    for kind, values in declaration.items():
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}; the kinds are {', '.join(KINDS)}")
        try:
            if cleaned := clean_values(kind, values):
                out[kind] = cleaned
        except (TypeError, ValueError) as e:
            raise ValueError(f"{kind}: {e}") from None
    return out


def _tenants(mapping: object, what: str, clean: Callable[[object], object]) -> dict[str, object]:
    if not isinstance(mapping, Mapping):
        raise ValueError(f"expected an object {{tenant: {what}}}")
    if len(mapping) > MAX_TENANTS:
        raise ValueError(f"{len(mapping)} tenants; at most {MAX_TENANTS}")
    out: dict[str, object] = {}
    for tenant, value in mapping.items():
        if not isinstance(tenant, str) or not tenant.strip() or len(tenant) > 128:
            raise ValueError(f"tenant {tenant!r} must be a non-empty name of at most 128 characters")
        try:
            out[tenant] = clean(value)
        except (TypeError, ValueError) as e:
            raise ValueError(f"tenant {tenant!r}: {e}") from None
    return out


def parse_business_names(mapping: Mapping[str, Iterable[object]]) -> dict[str, tuple[str, ...]]:
    """`{tenant: [names]}` --> validated names per tenant; raises ValueError naming the tenant and entry."""
    return _tenants(mapping, "[names]", lambda v: clean_names(v))  # type: ignore[arg-type,return-value]


def parse_business_data(mapping: Mapping[str, object]) -> dict[str, dict[str, tuple[str, ...]]]:
    """`{tenant: {kind: [values]}}` --> validated values per kind per tenant; raises ValueError naming the
    tenant, the kind and the entry."""
    return _tenants(mapping, "{kind: [values]}", clean_declaration)  # type: ignore[return-value]


# --- matching ----------------------------------------------------------------------------------------
def _name_pattern(name: str) -> str:
    """One name as a regex: its words literally, any run of whitespace between them, either apostrophe."""
    words = []
    for word in name.split():
        words.append("".join("['\u2019]" if c in "'\u2019" else re.escape(c) for c in word))
    return r"\s+".join(words)


def _address_pattern(address: str) -> str:
    """A street address as a regex: its words in order, whole, with any short run of spacing and light
    punctuation between them ("12 Harbour Road, Leith" = "12 Harbour Road\\nLeith")."""
    return r"[\s.,;:/#'\u2019\-]{1,4}".join(re.escape(w) for w in re.findall(r"\w+", address))


_PHONE_SEP = r"[\s.\-/()]{0,3}"


def _digits_pattern(digits: str) -> str:
    return _PHONE_SEP.join(digits)


def _phone_pattern(phone: str) -> str:
    """A declared phone number as a regex over its forms (see the module's doc), never inside a longer
    digit run."""
    intl, digits = _phone_digits(phone)
    national: set[str] = set()
    international: set[str] = set()
    if not intl:
        national.add(digits)
    else:
        international.add(digits)
        # heavy-ish (36 ms, its metadata): only where a tenant declares an international number
        import phonenumbers

        try:
            number = phonenumbers.parse("+" + digits, None)
        except phonenumbers.NumberParseException:
            number = None
        if number is not None and phonenumbers.is_possible_number(number):
            cc, nsn = str(number.country_code), phonenumbers.national_significant_number(number)
            written = re.sub(r"\D", "", phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.NATIONAL))
            national.add(written)                             # "0800 414 2277", "(415) 555-0132"
            region = phonenumbers.region_code_for_number(number)
            meta = phonenumbers.PhoneMetadata.metadata_for_region(region) if region else None
            prefix = (meta.national_prefix or "") if meta is not None else ""
            if prefix and not written.startswith(prefix):
                national.add(prefix + nsn)                    # "1 415 555 0132"
            if prefix and written.startswith(prefix):
                international.add(cc + prefix + nsn)          # "+44 (0)800 414 2277"
    forms = [rf"(?<![\d+]){_digits_pattern(d)}" for d in sorted(national, key=len, reverse=True)]
    forms += [rf"(?:\+\s?|(?<!\d)00[\s.\-]?){_digits_pattern(d)}"
              for d in sorted(international, key=len, reverse=True)]
    return rf"(?:{'|'.join(forms)})(?!\d)"


def _email_pattern(email: str) -> str:
    return rf"(?<![\w.+\-@]){re.escape(email)}(?![\w\-@]|\.[\w\-])"


def _url_pattern(url: str) -> str:
    return (rf"(?<![\w.\-@/:])(?:https?://)?(?:www\.)?{re.escape(_url_canonical(url))}/?"
            r"(?![\w\-%@]|[./?#=&+:][\w%])")


def _alternatives(patterns: Iterable[str], before: str = "", after: str = "") -> re.Pattern[str] | None:
    """One regex finding every occurrence of any of `patterns` (between the assertions `before` and `after`),
    overlapping ones included (a lookahead: "Harbor Point" / "Point Reyes"), the longest first where two start
    at one position."""
    alternatives = sorted(patterns, key=len, reverse=True)
    if not alternatives:
        return None
    return re.compile(rf"{before}(?=((?:{'|'.join(alternatives)})){after})", re.IGNORECASE)


class BusinessData:
    """One tenant's declared public business data, compiled once (`BusinessData.of` caches per distinct
    declaration)."""

    __slots__ = ("_names", "_structured", "addresses", "emails", "key", "names", "phones", "urls")

    def __init__(self, names: Sequence[str] = (), *, phones: Sequence[str] = (), emails: Sequence[str] = (),
                 addresses: Sequence[str] = (), urls: Sequence[str] = ()) -> None:
        self.names: tuple[str, ...] = clean_values(NAMES, names) if names else ()
        self.phones: tuple[str, ...] = clean_values(PHONES, phones) if phones else ()
        self.emails: tuple[str, ...] = clean_values(EMAILS, emails) if emails else ()
        self.addresses: tuple[str, ...] = clean_values(ADDRESSES, addresses) if addresses else ()
        self.urls: tuple[str, ...] = clean_values(URLS, urls) if urls else ()
        self._names = _alternatives((_name_pattern(n) for n in self.names), r"(?<!\w)", r"(?!\w)")
        self._structured = _alternatives([*(_phone_pattern(p) for p in self.phones),
                                          *(_email_pattern(e) for e in self.emails),
                                          *(_url_pattern(u) for u in self.urls),
                                          *(rf"(?<!\w){_address_pattern(a)}(?!\w)" for a in self.addresses)])
        declared = sorted(f"{kind}\x1e{normalised(kind, v)}" for kind, values in self.declaration().items()
                          for v in values)
        self.key: bytes = (hashlib.blake2b("\x1f".join(declared).encode(), digest_size=16).digest()
                           if declared else b"")
        """Part of every cache key of a scan under this declaration (b"" when there is none)."""

    @classmethod
    def of(cls, names: Iterable[str] = (), *, phones: Iterable[str] = (), emails: Iterable[str] = (),
           addresses: Iterable[str] = (), urls: Iterable[str] = ()) -> BusinessData:
        """The compiled declaration (one instance per distinct declaration: settings ask for it on every
        capture)."""
        return _compiled(tuple(names), tuple(phones), tuple(emails), tuple(addresses), tuple(urls))

    @classmethod
    def from_declaration(cls, *declarations: Mapping[str, Iterable[str]]) -> BusinessData:
        """`{kind: [values]}` (several are merged, in order) --> the compiled declaration."""
        merged: dict[str, list[str]] = {k: [] for k in KINDS}
        for declaration in declarations:
            for kind, values in declaration.items():
                if kind not in merged:
                    raise ValueError(f"unknown kind {kind!r}; the kinds are {', '.join(KINDS)}")
                merged[kind] += values
        return cls.of(merged[NAMES], phones=merged[PHONES], emails=merged[EMAILS], addresses=merged[ADDRESSES],
                      urls=merged[URLS])

    def declaration(self) -> dict[str, tuple[str, ...]]:
        """{kind: values} of the kinds declared."""
        every = {NAMES: self.names, PHONES: self.phones, EMAILS: self.emails, ADDRESSES: self.addresses,
                 URLS: self.urls}
        return {k: v for k, v in every.items() if v}

    def __bool__(self) -> bool:
        return bool(self.key)

    def __repr__(self) -> str:
        return f"BusinessData({', '.join(f'{k}={list(v)!r}' for k, v in self.declaration().items())})"

    @staticmethod
    def _find(pattern: re.Pattern[str] | None, text: str) -> list[tuple[int, int]]:
        if pattern is None or not text:
            return []
        return [(m.start(1), m.end(1)) for m in pattern.finditer(detection_view(text))]

    def occurrences(self, text: str) -> list[tuple[int, int]]:
        """(start, end) of every occurrence in `text` of a declared value of any kind: what a detected or
        user-given *name* may lie inside (a name word inside the declared street address "Dana Point" is the
        place, not a user)."""
        return sorted(self._find(self._names, text) + self._find(self._structured, text))

    def structured_occurrences(self, text: str) -> list[tuple[int, int]]:
        """(start, end) of every occurrence in `text` of a declared phone, e-mail, web or street address: what
        a detection of any type may lie inside."""
        return self._find(self._structured, text)

    def covers(self, text: str, start: int, end: int, occurrences: Sequence[tuple[int, int]] | None = None) -> bool:
        """Every letter and digit of `text[start:end]` (less a possessive "'s") lies inside `occurrences`
        (default: of every declared value): one name, or values written next to each other that NER read as
        one ("Regards,\\nDana Reyes\\nTrailmate"). A word outside every occurrence ("Smith" in "Dana Whitfield
        Smith") leaves the span uncovered."""
        occ = self.occurrences(text) if occurrences is None else occurrences
        if not occ:
            return False
        if end - start > 2 and text[end - 2] in "'\u2019" and text[end - 1] in "sS":
            end -= 2
        letters = [i for i in range(start, end) if text[i].isalnum()]
        return bool(letters) and all(any(a <= i < b for a, b in occ) for i in letters)

    def keep(self, text: str, spans: Iterable[Span]) -> list[Span]:
        """`spans` less those that are only declared data (what redaction then removes): a name inside declared
        values of any kind, any detection inside declared phones, e-mails, web or street addresses."""
        spans = list(spans)
        if not spans or not self.key:
            return spans
        structured = self.structured_occurrences(text)
        anything = sorted(structured + self._find(self._names, text)) if any(
            s.entity in NAME_EXEMPTIBLE for s in spans) else structured
        if not anything:
            return spans
        return [s for s in spans if not self.covers(text, s.start, s.end,
                                                    anything if s.entity in NAME_EXEMPTIBLE else structured)]


@functools.lru_cache(maxsize=1024)
def _compiled(names: tuple[str, ...], phones: tuple[str, ...], emails: tuple[str, ...], addresses: tuple[str, ...],
              urls: tuple[str, ...]) -> BusinessData:
    return BusinessData(names, phones=phones, emails=emails, addresses=addresses, urls=urls)


NO_DATA = BusinessData()
"""A tenant that declared nothing: every detection is redacted."""

