"""PII rejection: emails, phones, card numbers (Luhn), names users gave (messages and corrections), the
shared detector; no false alarms on plain rules."""

from __future__ import annotations

import pytest

from services.extractor.curation import Curator
from services.extractor.pii import find_pii, luhn_ok, names_from_user_texts
from services.extractor.trajectories import SessionBuffer
from tests.unit.extractor.factories import graded


@pytest.mark.parametrize(("text", "kind"), [
    ("Send the invoice to ana.lima@example.com after payment.", "email"),
    ("Escalate to j_doe+vip@support.acme.co.uk for VIP customers.", "email"),
    ("Call the customer back at +1 (415) 555-0132 before noon.", "phone"),
    ("The customer's number is 0049 30 1234567 so call it.", "phone"),
    ("Refund to card 4111 1111 1111 1111 was processed.", "card"),
    ("Card 5500-0000-0000-0004 belongs to the customer.", "card"),
    ("Refund to card 4111.1111.1111.1111 was processed.", "card"),
    ("Dana Whitfield always wants refunds by bank transfer.", "name"),
    ("Their SSN 536-22-1843 was on file for this case.", "ssn"),
    ("Wire the refund to DE44 5001 0517 5407 3249 31 today.", "iban"),
])
def test_personal_data_is_found(text: str, kind: str) -> None:
    assert kind in find_pii(text)


@pytest.mark.parametrize("text", [
    "Returns need form R-12 within 30 days of delivery.",
    "Billing questions go to extension 4417.",
    "The warranty lasts 24 months for all devices since 2024-01-15.",
    "Move down twice, then right twice, to reach the goal.",
    "Answer in at most 3 sentences and cite the policy number 12.",
])
def test_plain_rules_pass(text: str) -> None:
    assert find_pii(text) == []


def test_luhn() -> None:
    assert luhn_ok("4111 1111 1111 1111")
    assert not luhn_ok("4111 1111 1111 1112")
    assert not luhn_ok("1234")


def test_names_from_user_fields() -> None:
    texts = ["Hi, my name is Ana Lima and I am looking for a refund.", "I'm Sorry to bother you",
             "It broke again.\nThanks,\nBob", "this is Priya from accounting"]
    assert names_from_user_texts(texts) == {"Ana", "Lima", "Bob", "Priya"}
    assert "name:Ana" in find_pii("Ana prefers refunds by bank transfer.", {"Ana"})
    # case-sensitive: the verb "will" is not the name "Will"
    assert find_pii("The agent will confirm the order number.", {"Will"}) == []


def test_curator_rejects_pii_and_bad_lengths() -> None:
    c = Curator(min_chars=12, max_chars=80)
    names = sorted(names_from_user_texts(["my name is Carla"]))
    assert c.rejection("Carla always wants refunds by bank transfer.", names).startswith("personal data: name")
    assert c.rejection("Mail receipts to x@y.io always.").startswith("personal data: email")
    assert c.rejection("Too short").startswith("too short")
    assert c.rejection("A rule " + "that goes on " * 10).startswith("too long")
    assert c.rejection("@@@@ #### $$$$ %%%% ^^^^") == "not readable text"
    assert c.rejection("Confirm the order number before refunds.") == ""


def test_a_name_given_only_in_a_correction_keeps_items_with_it_out() -> None:
    """The attack: the name reached the base because names were looked up in user messages only."""
    buf = SessionBuffer(gap_s=0, max_turns=8)
    buf.add(graded(correction="The account holder is Dana Whitfield, card 4111.1111.1111.1111."))
    [(traj, _)] = buf.ready()
    names = sorted(names_from_user_texts(traj.user_texts))
    assert {"Dana", "Whitfield"} <= set(names)
    c = Curator()
    assert c.rejection("Whitfield prefers refunds by bank transfer.", names).startswith("personal data: name")
    assert "card" in c.rejection("When a refund is due, charge back the card 4111.1111.1111.1111 used for it.", names)
