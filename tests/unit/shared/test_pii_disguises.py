"""Personal data in its disguises (spelled-out at/dot, unicode digits, mixed separators, dotted IBANs,
values split across messages, session ids) is found, with the entity it is, and prose that reads like a
disguise is not (shared/privacy/recognizers.py, detector.py)."""

from __future__ import annotations

import pytest

from shared.privacy import get_detector
from shared.privacy.detector import CARD, EMAIL, IBAN, PHONE, SESSION_ID, SSN, detection_view


def _found(text: str, value: str, entity: str) -> bool:
    a = text.index(value)
    return any(s.entity == entity and s.start <= a and s.end >= a + len(value) for s in get_detector().find(text))


@pytest.mark.parametrize(("text", "value", "entity"), [
    ("write to jane dot doe at example dot com please", "jane dot doe at example dot com", EMAIL),
    ("my address is jane(at)example(dot)com", "jane(at)example(dot)com", EMAIL),
    ("reach me: jane [at] example [dot] org", "jane [at] example [dot] org", EMAIL),
    ("mail omar.haddad AT gmail DOT com now", "omar.haddad AT gmail DOT com", EMAIL),
    ("send it to sven@lindqvist dot se", "sven@lindqvist dot se", EMAIL),
    ("call me on +４４ ２０ ７９４６ ０９５８ tonight", "+４４ ２０ ７９４６ ０９５８", PHONE),
    ("card ４１１１ １１１１ １１１１ １１１１ exp 09/27", "４１１１ １１１１ １１１１ １１１１", CARD),
    ("SSN ５３６-２２-８７２６ on the form", "５３６-２２-８７２６", SSN),
    ("card ४१११ ११११ ११११ ११११ please refund", "४१११ ११११ ११११ ११११", CARD),
    ("visa ٤١١١-١١١١-١١١١-١١١١ was charged", "٤١١١-١١١١-١١١١-١١١١", CARD),
    ("ring +1 (415) 555.2671 after six", "+1 (415) 555.2671", PHONE),
    ("card 4111-1111 1111.1111 was declined", "4111-1111 1111.1111", CARD),
    ("IBAN DE89.3704.0044.0532.0130.00 for the refund", "DE89.3704.0044.0532.0130.00", IBAN),
    ("FR14/2004/1010/0505/0001/3M02/606 is mine", "FR14/2004/1010/0505/0001/3M02/606", IBAN),
    ("my session id is 3f2b9c1e-8d4a-4f6b-9e2d-7a1c5b8e0f93", "3f2b9c1e-8d4a-4f6b-9e2d-7a1c5b8e0f93", SESSION_ID),
    ("customer id CUST9x8y7z6w5v4u3t2 still locked", "CUST9x8y7z6w5v4u3t2", SESSION_ID),
])
def test_disguised_values_are_found(text: str, value: str, entity: str) -> None:
    assert _found(text, value, entity)


@pytest.mark.parametrize("text", [
    "meet at the dot of noon at the station",
    "the train leaves at 5 dot 30, be there at six",
    "look at example dot com style names, they are generic",
    "I'm at home dot dot dot waiting",
    "Version ２.４.１ fixed it; build ４１１ is older",
    "Use UUID 123e4567-e89b-12d3-a456-426614174000 as the request id.",
    "DE89.3704.0044.0532.0130.01 fails its checksum",
    "card 4111-1111 1111.1112 fails Luhn",
])
def test_prose_and_near_misses_are_left_alone(text: str) -> None:
    assert [s for s in get_detector().find(text) if s.entity != "PERSON"] == []


def test_the_detection_view_keeps_positions() -> None:
    text = "（４１５） ５５५-٢٦७१ ok"
    view = detection_view(text)
    assert len(view) == len(text) and view == "(415) 555-2671 ok"
    assert detection_view("plain ascii") == "plain ascii"


@pytest.mark.parametrize(("messages", "pieces"), [
    (["my email is jane.doe@exa", "mple.com sorry"], ["jane.doe@exa", "mple.com"]),
    (["call me on +44 20 7946", "0958 after 5pm"], ["+44 20 7946", "0958"]),
    (["IBAN DE89 3704 0044", "0532 0130 00 thanks"], ["DE89 3704 0044", "0532 0130 00"]),
])
def test_a_value_split_across_two_messages_is_found_in_both(messages: list[str], pieces: list[str]) -> None:
    found = get_detector().find_conversation(messages)
    for text, piece, spans in zip(messages, pieces, found, strict=True):
        a = text.index(piece)
        assert any(s.start <= a and s.end >= a + len(piece) for s in spans), (piece, spans)


def test_adjacent_messages_do_not_join_into_false_values() -> None:
    found = get_detector().find_conversation(["I ordered 2 at 10:30", "and 3 more today"])
    assert found == [[], []]
