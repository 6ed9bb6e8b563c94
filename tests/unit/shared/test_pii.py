"""The shared PII detector: checksums, the labelled set (recall/precision floors), policies and redaction."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.privacy import (
    PiiPolicy,
    Redactor,
    Span,
    card_ok,
    get_detector,
    iban_ok,
    luhn_ok,
    parse_tenant_policies,
)
from shared.privacy.detector import CARD, EMAIL, IBAN, PERSON, PHONE, resolve_overlaps
from shared.privacy.evaluation import load_labelled, overall, score
from shared.privacy.policy import redact

LABELLED = Path(__file__).resolve().parents[2] / "data" / "pii_labelled.jsonl"


# --- checksums -------------------------------------------------------------------------------------
@pytest.mark.parametrize("number", ["4111 1111 1111 1111", "4111.1111.1111.1111", "5555-5555-5555-4444",
                                    "378282246310005", "6011 0009 9013 9424", "3056 930902 5904"])
def test_real_card_numbers_pass(number: str) -> None:
    assert luhn_ok(number) and card_ok(number)


@pytest.mark.parametrize("number", ["4111 1111 1111 1112", "1234 5678 9012 3456", "4111", "0000 0000 0000 0000",
                                    "9111 1111 1111 1117"])   # last: Luhn-valid, but no issuer starts with 9
def test_card_like_numbers_fail(number: str) -> None:
    assert not card_ok(number)


def test_luhn_by_hand() -> None:
    # 79927398713: the textbook example (sum 70)
    assert luhn_ok("79927398713") and not luhn_ok("79927398710")


@pytest.mark.parametrize("code", ["DE89 3704 0044 0532 0130 00", "GB29NWBK60161331926819", "gb29 nwbk 6016 1331 9268 19",
                                  "NO93 8601 1117 947", "FR14-2004-1010-0505-0001-3M02-606"])
def test_real_ibans_pass(code: str) -> None:
    assert iban_ok(code)


@pytest.mark.parametrize("code", ["DE89 3704 0044 0532 0130 01",   # check digits wrong
                                  "DE89 3704 0044 0532 0130",      # German IBANs have 22 characters
                                  "XX89 3704 0044 0532 0130 00",   # no such country
                                  "DE00 0000 0000 0000 0000 00"])
def test_bad_ibans_fail(code: str) -> None:
    assert not iban_ok(code)


# --- the detector on the labelled set ------------------------------------------------------------------
@pytest.fixture(scope="module")
def scores() -> dict:
    examples = load_labelled(LABELLED)
    assert len(examples) >= 200
    assert sum(1 for e in examples if not e.entities) >= 50, "the set needs negatives"
    return score(get_detector(), examples)


@pytest.mark.parametrize("entity", [CARD, EMAIL, PHONE])
def test_recall_on_cards_emails_phones(scores: dict, entity: str) -> None:
    sc = scores[entity]
    assert sc.labelled >= 40
    assert sc.recall >= 0.98, f"{entity} recall {sc.recall:.3f}; missed: {sc.misses}"


@pytest.mark.parametrize(("entity", "floor"), [(CARD, 0.95), (EMAIL, 0.95), (PHONE, 0.95), (IBAN, 0.95),
                                                 ("IP_ADDRESS", 0.9), (PERSON, 0.85)])
def test_precision_floor(scores: dict, entity: str, floor: float) -> None:
    sc = scores[entity]
    assert sc.precision >= floor, f"{entity} precision {sc.precision:.3f}; false alarms: {sc.false_alarms}"


def test_overall_and_names(scores: dict) -> None:
    total = overall(scores)
    assert total.recall >= 0.95 and total.precision >= 0.95
    assert scores[PERSON].recall >= 0.85 and scores[IBAN].recall >= 0.95


def test_the_attack_strings_are_found() -> None:
    text = "I'm Dana Whitfield: refund card 4111.1111.1111.1111 and write to dana.w@example.com"
    found = {(s.entity, text[s.start:s.end]) for s in get_detector().find(text)}
    assert found == {(PERSON, "Dana Whitfield"), (CARD, "4111.1111.1111.1111"), (EMAIL, "dana.w@example.com")}


# --- policy ------------------------------------------------------------------------------------------
def test_tenant_policies_parse_and_refuse_bad_entries() -> None:
    assert parse_tenant_policies(" a:keep, b:REJECT ,") == {"a": PiiPolicy.KEEP, "b": PiiPolicy.REJECT}
    assert parse_tenant_policies("") == {}
    for bad, needle in [("a", "tenant:policy"), ("a:erase", "one of redact, reject, keep"),
                        ("a:keep,a:redact", "listed twice"), (":keep", "tenant:policy")]:
        with pytest.raises(ValueError, match=needle):
            parse_tenant_policies(bad)


def test_redact_replaces_spans_with_typed_placeholders() -> None:
    text = "mail a@b.io or call 555"
    assert redact(text, [Span(5, 11, EMAIL), Span(20, 23, PHONE)]) == "mail <EMAIL_ADDRESS> or call <PHONE_NUMBER>"
    # overlaps: the checksummed type wins over the phone reading of the same digits
    kept = resolve_overlaps([Span(0, 19, PHONE, 0.4), Span(0, 19, CARD, 1.0), Span(25, 30, PERSON, 0.85)])
    assert [s.entity for s in kept] == [CARD, PERSON]


def test_redactor_caches_by_text() -> None:
    calls: list[str] = []

    class Counting:
        def find(self, text: str, *, names: bool = True) -> list[Span]:
            calls.append(text)
            return [Span(0, 4, PERSON)] if text.startswith("Dana") else []

    r = Redactor(lambda: Counting(), cache_size=2)   # type: ignore[arg-type, return-value]
    assert r.scan("Dana says hi", tenant="t").redacted == "<PERSON> says hi"
    assert r.scan("Dana says hi", tenant="t").types == [PERSON]
    assert r.scan("", tenant="t").spans == () and calls == ["Dana says hi"]
    r.scan("x", tenant="t"), r.scan("y", tenant="t"), r.scan("Dana says hi", tenant="t")             # evicted (size 2): scanned again
    assert calls == ["Dana says hi", "x", "y", "Dana says hi"]
