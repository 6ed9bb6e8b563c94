"""Digits --> is this a real card number / IBAN? The checksums that keep card and IBAN detection precise.

A 16-digit order number passes the Luhn check one time in ten and a random 22-character code passes the
ISO 13616 check one time in 97, so a pattern match is personal data only when its checksum holds (and,
for IBANs, its length is the one its country uses).
"""

from __future__ import annotations

import re

_NON_DIGITS = re.compile(r"\D")
_NON_ALNUM = re.compile(r"[^A-Za-z0-9]")

# ISO 13616 IBAN length per country (SWIFT IBAN registry); a code of another length is not an IBAN.
IBAN_LENGTHS: dict[str, int] = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22, "BI": 27,
    "BR": 29, "BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DJ": 27, "DK": 18, "DO": 28,
    "EE": 20, "EG": 29, "ES": 24, "FI": 18, "FK": 18, "FO": 18, "FR": 27, "GB": 22, "GE": 22, "GI": 23,
    "GL": 18, "GR": 27, "GT": 28, "HN": 28, "HR": 21, "HU": 28, "IE": 22, "IL": 23, "IQ": 23, "IS": 26,
    "IT": 27, "JO": 30, "KW": 30, "KZ": 20, "LB": 28, "LC": 32, "LI": 21, "LT": 20, "LU": 20, "LV": 21,
    "LY": 25, "MC": 27, "MD": 24, "ME": 22, "MK": 19, "MN": 20, "MR": 27, "MT": 31, "MU": 30, "NI": 28,
    "NL": 18, "NO": 15, "OM": 23, "PK": 24, "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22,
    "RU": 33, "SA": 24, "SC": 31, "SD": 18, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "SO": 23, "ST": 25,
    "SV": 28, "TL": 23, "TN": 24, "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20, "YE": 30,
}


def digits(text: str) -> str:
    """The digits of `text`, separators (spaces, dots, dashes) dropped."""
    return _NON_DIGITS.sub("", text)


def luhn_ok(number: str) -> bool:
    """The Luhn (mod 10) checksum every payment card number satisfies; separators are ignored (the
    length of a card number is `card_ok`'s business)."""
    ds = [int(c) for c in digits(number)]
    if len(ds) < 2:
        return False
    total = 0
    for i, d in enumerate(reversed(ds)):
        if i % 2 == 1:          # every second digit from the right is doubled; 2-digit results add up
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def card_ok(number: str) -> bool:
    """A payment card number: 13-19 digits, an issuer prefix in use (2-6: Mastercard 2-series, Amex/
    Diners/JCB, Visa, Mastercard/Maestro, Discover/UnionPay), and the Luhn check."""
    ds = digits(number)
    return 13 <= len(ds) <= 19 and ds[0] in "23456" and luhn_ok(ds)


def iban_ok(code: str) -> bool:
    """ISO 13616: the country's IBAN length, then the mod-97 check (first four characters moved to the
    end, letters as 10..35, the whole number mod 97 == 1). Spaces and dashes are ignored."""
    s = _NON_ALNUM.sub("", code).upper()
    if len(s) < 15 or not (s[:2].isalpha() and s[2:4].isdigit()):
        return False
    if IBAN_LENGTHS.get(s[:2]) != len(s):
        return False
    rearranged = s[4:] + s[:4]
    as_number = "".join(str(int(c, 36)) for c in rearranged)   # '0'-'9' -> 0-9, 'A'-'Z' -> 10-35
    return int(as_number) % 97 == 1
