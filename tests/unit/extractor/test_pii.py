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


def test_declared_business_names_can_be_learned_but_users_names_cannot() -> None:
    """A correction names the tenant's product and the staff member who decided: with the tenant's business
    names (APPRENTICE_BUSINESS_NAMES) the fact enters the base; the user's name, a word the user's name
    shares with the staff name, and an e-mail still keep items out; another tenant's base gets no exemption."""
    from services.extractor.knowledge import Candidate, Extracted, KnowledgeStore
    from shared.settings import CommonSettings

    common = CommonSettings(business_names={"acme": ["Trailmate", "Dana Whitfield"]})
    fact = "Dana Whitfield at our returns desk approves refunds for Trailmate orders."
    cands = [fact, "Dana prefers refunds by bank transfer.", "Write to dana.whitfield@trailmate.com for refunds."]

    def verdicts(tenant: str) -> list[tuple[str, str]]:
        buf = SessionBuffer(gap_s=0, max_turns=8)
        buf.add(graded(tenant=tenant, question="Hi, I'm Dana Smith. Who approves my refund?",
                       correction="This is Trailmate support: Dana Whitfield at our returns desk approves it."))
        [(traj, _)] = buf.ready()
        store = KnowledgeStore(Curator(), lambda snap: None, requires_approval=lambda t: True,
                               business_data=common.business_data_for)
        _, vs = store.apply(f"{tenant}/support", [Extracted(traj, [Candidate(c, "x", ["i1"]) for c in cands])])
        return [(v.outcome, v.reason) for v in vs]

    acme = verdicts("acme")
    assert acme[0] == ("added", "")
    assert acme[1] == ("rejected", "personal data: name") and acme[2] == ("rejected", "personal data: email")
    assert [o for o, _ in verdicts("globex")] == ["rejected", "rejected", "rejected"]
    # the user's name words are collected, the declared names are not
    texts = ["Hi, I'm Dana Smith.", "This is Trailmate support: Dana Whitfield approves it."]
    assert names_from_user_texts(texts, common.business_data_for("acme")) == {"Dana", "Smith"}
    assert {"Trailmate", "Whitfield"} <= names_from_user_texts(texts)


def test_the_tenants_declared_phone_and_email_can_be_learned_but_a_users_cannot() -> None:
    """The second task's two facts that could never be learned: with the tenant's public business data
    (APPRENTICE_BUSINESS_DATA) they enter its base; a user's number, or the same facts in another tenant's
    base, still keep items out."""
    from services.extractor.knowledge import Candidate, Extracted, KnowledgeStore
    from shared.settings import CommonSettings

    common = CommonSettings(business_data={"acme": {"phones": ["+44 800 414 2277"],
                                                    "emails": ["found@trailmate.co.uk"]}})
    cands = ["Call customer service on 0800 414 2277 for any order question.",
             "Write to found@trailmate.co.uk about lost property.",
             "Call the customer back on 07700 900123 before noon.",
             "Customers may also write to lost.found@trailmate.co.uk."]

    def verdicts(tenant: str) -> list[tuple[str, str]]:
        buf = SessionBuffer(gap_s=0, max_turns=8)
        buf.add(graded(tenant=tenant, question="hw do i reach u guys?? lost my jacket",
                       correction="Call customer service on 0800 414 2277. Write to found@trailmate.co.uk about "
                                  "lost property."))
        [(traj, _)] = buf.ready()
        store = KnowledgeStore(Curator(), lambda snap: None, requires_approval=lambda t: True,
                               business_data=common.business_data_for)
        _, vs = store.apply(f"{tenant}/support", [Extracted(traj, [Candidate(c, "x", ["i1"]) for c in cands])])
        return [(v.outcome, v.reason) for v in vs]

    assert verdicts("acme") == [("added", ""), ("added", ""), ("rejected", "personal data: phone"),
                                ("rejected", "personal data: email")]
    assert verdicts("globex") == [("rejected", "personal data: phone"), ("rejected", "personal data: email"),
                                  ("rejected", "personal data: phone"), ("rejected", "personal data: email")]
