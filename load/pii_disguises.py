"""Personal data in its common disguises, labelled: the cases `load/pii_bench.py` (section 1d) scores per
form, written before the detector learned them (SECURITY.md, personal data).

Each case is a conversation (one or more messages) with the values in it that are personal data; a value
that spans two messages is given as its two pieces, each labelled in its own message. Recall per form:
every letter/digit of each labelled piece lies inside some detection (of any type: what matters for
redaction is that it is masked). Negatives (`NEGATIVE` form) are ordinary prose that reads like a disguise
("meet at the dot", "at 5 dot 30"); any detection in them counts against precision.

Session ids: a UUID, or a token of 16+ letters/digits with both, named in the text as a session, account,
user, customer or device id. The OpenAI `user` field: its value as the capture records it (the bench scans
it as the detector would see it, alone).
"""

from __future__ import annotations

from dataclasses import dataclass

NEGATIVE = "negative (prose)"


@dataclass(frozen=True)
class Case:
    form: str
    messages: tuple[str, ...]
    values: tuple[tuple[int, str], ...]
    """(message index, the exact substring that is personal data)."""


def _c(form: str, text: str | tuple[str, ...], *values: str | tuple[int, str]) -> Case:
    messages = (text,) if isinstance(text, str) else text
    vals = tuple(v if isinstance(v, tuple) else (0, v) for v in values)
    for i, v in vals:
        assert v in messages[i], (v, messages[i])
    return Case(form, messages, vals)


CASES: list[Case] = [
    # spelled-out e-mail addresses
    _c("spelled-out e-mail", "write to jane dot doe at example dot com please", "jane dot doe at example dot com"),
    _c("spelled-out e-mail", "my address is jane(at)example(dot)com", "jane(at)example(dot)com"),
    _c("spelled-out e-mail", "reach me: jane [at] example [dot] org", "jane [at] example [dot] org"),
    _c("spelled-out e-mail", "mail omar.haddad AT gmail DOT com for the receipt", "omar.haddad AT gmail DOT com"),
    _c("spelled-out e-mail", "It's priya_raman {at} outlook {dot} co {dot} uk", "priya_raman {at} outlook {dot} co {dot} uk"),
    _c("spelled-out e-mail", "contact: t.becker at web dot de", "t.becker at web dot de"),
    _c("spelled-out e-mail", "send it to sven@lindqvist dot se", "sven@lindqvist dot se"),
    _c("spelled-out e-mail", "email dana.whitfield (at) example.com today", "dana.whitfield (at) example.com"),
    # full-width digits (U+FF10..FF19)
    _c("full-width digits", "call me on +４４ ２０ ７９４６ ０９５８ tonight", "+４４ ２０ ７９４６ ０９５８"),
    _c("full-width digits", "card ４１１１ １１１１ １１１１ １１１１ exp 09/27", "４１１１ １１１１ １１１１ １１１１"),
    _c("full-width digits", "my number is （４１５） ５５５-２６７１", "（４１５） ５５５-２６７１"),
    _c("full-width digits", "SSN ０７８-０５-１１２０ on the form", "０７８-０５-１１２０"),
    # Devanagari / Arabic-Indic digits
    _c("indic/arabic digits", "मेरा नंबर +९१ ९८७६५ ४३२१० है", "+९१ ९८७६५ ४३२१०"),
    _c("indic/arabic digits", "card ४१११ ११११ ११११ ११११ please refund", "४१११ ११११ ११११ ११११"),
    _c("indic/arabic digits", "رقمي +٩٧١ ٥٠ ١٢٣ ٤٥٦٧", "+٩٧١ ٥٠ ١٢٣ ٤٥٦٧"),
    _c("indic/arabic digits", "visa ٤١١١-١١١١-١١١١-١١١١ was charged twice", "٤١١١-١١١١-١١١١-١١١١"),
    _c("indic/arabic digits", "call +۴۴ ۲۰ ۷۹۴۶ ۰۹۵۸ (Persian digits)", "+۴۴ ۲۰ ۷۹۴۶ ۰۹۵۸"),
    # mixed separators
    _c("mixed separators", "ring +1 (415) 555.2671 after six", "+1 (415) 555.2671"),
    _c("mixed separators", "card 4111-1111 1111.1111 was declined", "4111-1111 1111.1111"),
    _c("mixed separators", "mastercard 5500 0000-0000.0004 please", "5500 0000-0000.0004"),
    _c("mixed separators", "phone 020.7946 0958 (London)", "020.7946 0958"),
    _c("mixed separators", "my cell is 415-555 2671.", "415-555 2671"),
    _c("mixed separators", "card: 4111 1111-1111 1111", "4111 1111-1111 1111"),
    # dotted / spaced IBANs
    _c("dotted/spaced IBAN", "IBAN DE89.3704.0044.0532.0130.00 for the refund", "DE89.3704.0044.0532.0130.00"),
    _c("dotted/spaced IBAN", "pay to GB82 WEST 1234 5698 7654 32 today", "GB82 WEST 1234 5698 7654 32"),
    _c("dotted/spaced IBAN", "account GB82.WEST.1234.5698.7654.32", "GB82.WEST.1234.5698.7654.32"),
    _c("dotted/spaced IBAN", "iban: de89 3704 0044 0532 0130 00", "de89 3704 0044 0532 0130 00"),
    _c("dotted/spaced IBAN", "FR14/2004/1010/0505/0001/3M02/606 is mine", "FR14/2004/1010/0505/0001/3M02/606"),
    _c("dotted/spaced IBAN", "transfer to NL91 ABNA 0417.1643 00", "NL91 ABNA 0417.1643 00"),
    # split across two messages of one conversation
    _c("split across messages", ("my email is jane.doe@exa", "mple.com sorry, hit enter"),
       (0, "jane.doe@exa"), (1, "mple.com")),
    _c("split across messages", ("you can call me on +44 20 7946", "0958 after 5pm"),
       (0, "+44 20 7946"), (1, "0958")),
    _c("split across messages", ("card number 4111 1111", "1111 1111"), (0, "4111 1111"), (1, "1111 1111")),
    _c("split across messages", ("IBAN DE89 3704 0044", "0532 0130 00 thanks"), (0, "DE89 3704 0044"), (1, "0532 0130 00")),
    _c("split across messages", ("email: omar.haddad@", "gmail.com"), (0, "omar.haddad@"), (1, "gmail.com")),
    # the OpenAI `user` field, as recorded (the value alone)
    _c("OpenAI user field", "jane.doe@example.com", "jane.doe@example.com"),
    _c("OpenAI user field", "user-8f14e45f-ceea-467a-9af0-7c4d5b3e2a11", "user-8f14e45f-ceea-467a-9af0-7c4d5b3e2a11"),
    _c("OpenAI user field", "+14155552671", "+14155552671"),
    _c("OpenAI user field", "cus_Nf8a3kQ92LmZx7Tq", "cus_Nf8a3kQ92LmZx7Tq"),
    # session / account ids named in the text
    _c("session id", "my session id is 3f2b9c1e-8d4a-4f6b-9e2d-7a1c5b8e0f93", "3f2b9c1e-8d4a-4f6b-9e2d-7a1c5b8e0f93"),
    _c("session id", "account id: AC7f3k9QpL2m8Zx4Wn", "AC7f3k9QpL2m8Zx4Wn"),
    _c("session id", "session=a8f5f167f44f4964e6c998dee827110c broke", "a8f5f167f44f4964e6c998dee827110c"),
    _c("session id", "customer id CUST9x8y7z6w5v4u3t2 still locked", "CUST9x8y7z6w5v4u3t2"),
    _c("session id", "user id 550e8400-e29b-41d4-a716-446655440000", "550e8400-e29b-41d4-a716-446655440000"),
    # ordinary prose: nothing to redact
    _c(NEGATIVE, "meet at the dot of noon at the station"),
    _c(NEGATIVE, "the train leaves at 5 dot 30, be there at six"),
    _c(NEGATIVE, "look at example dot com style names, they are generic"),
    _c(NEGATIVE, "I'm at home dot dot dot waiting"),
    _c(NEGATIVE, "Version ２.４.１ fixed it; build ４１１ is older"),
    _c(NEGATIVE, "order १२३४५ arrived, total ४५० rupees"),
    _c(NEGATIVE, "The release notes say 1.2.3-beta at 10:30"),
    _c(NEGATIVE, "our office is at 4th and Main, open 9 to 5"),
    _c(NEGATIVE, "the model id is gpt-4o-mini and the temperature 0.7"),
    _c(NEGATIVE, "tracking code is in the email, at the top, dot point three"),
    _c(NEGATIVE, "DE is at 89 points, GB at 82"),
    _c(NEGATIVE, "error code 0x8004005 at startup"),
]
