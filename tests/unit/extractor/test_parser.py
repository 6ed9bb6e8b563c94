"""Parser on adversarial model outputs: chatter, numbering, missing prefixes, reasoning, garbage."""

from __future__ import annotations

import random

import pytest

from services.extractor.parser import clean_item, looks_like_text, parse_items


def test_the_requested_format() -> None:
    text = ("Additional Experience:\n# Experience\n"
            "- EXPERIENCE ITEM: Ask for the order number before promising a refund.\n"
            "- EXPERIENCE ITEM: Returns need form R-12 within 30 days.\n")
    assert parse_items(text) == ["Ask for the order number before promising a refund.",
                                 "Returns need form R-12 within 30 days."]


def test_chatter_around_items_is_ignored() -> None:
    text = ("Sure! Let me think step by step about what happened here.\nThe user was unhappy.\n"
            "Here are the items:\n- EXPERIENCE ITEM: Quote the warranty as 24 months, not one year.\n"
            "I hope this helps! Let me know if you need anything else.")
    assert parse_items(text) == ["Quote the warranty as 24 months, not one year."]


@pytest.mark.parametrize("line", [
    "1. EXPERIENCE ITEM: Check the return window before answering.",
    "**EXPERIENCE ITEM:** Check the return window before answering.",
    "- **Experience Item 2**: Check the return window before answering.",
    "experience item - Check the return window before answering.",
    "  * EXPERIENCE_ITEM: \"Check the return window before answering.\"",
    "- EXPERIENCE ITEM： Check the return window before answering.",   # full-width colon
])
def test_marker_variants(line: str) -> None:
    assert parse_items(line) == ["Check the return window before answering."]


def test_several_items_on_one_line_and_placeholders() -> None:
    text = "- EXPERIENCE ITEM: ... - EXPERIENCE ITEM: Move down first when the top row has holes. - EXPERIENCE ITEM: <...>"
    assert parse_items(text) == ["Move down first when the top row has holes."]


def test_missing_prefix_falls_back_to_list_lines_but_not_headings() -> None:
    text = ("Rules:\n1. Always confirm the customer's order number first.\n"
            "2) Offer the extended warranty only to premium members.\n- Strategies:\n* ok\n")
    assert parse_items(text) == ["Always confirm the customer's order number first.",
                                 "Offer the extended warranty only to premium members."]


def test_prose_without_structure_yields_nothing() -> None:
    assert parse_items("I think the answer was wrong because the model did not know the policy.") == []


def test_reasoning_blocks_are_dropped() -> None:
    text = ("<think>- EXPERIENCE ITEM: a thought that is not an answer at all</think>\n"
            "- EXPERIENCE ITEM: Use extension 4417 for billing questions.")
    assert parse_items(text) == ["Use extension 4417 for billing questions."]
    unclosed = "let me reason - EXPERIENCE ITEM: draft idea number one here</think>- EXPERIENCE ITEM: Final rule is written here."
    assert parse_items(unclosed) == ["Final rule is written here."]


def test_prompt_echoes_and_duplicates_are_dropped_and_count_limited() -> None:
    text = ("- EXPERIENCE ITEM: Round1_Input: How long is the warranty?\n"
            "- EXPERIENCE ITEM: Final Result: Failure of the task here\n"
            "- EXPERIENCE ITEM: Warranty questions: answer 24 months.\n"
            "- EXPERIENCE ITEM: warranty questions: answer 24 months.\n"
            "- EXPERIENCE ITEM: Mention the form code R-12 for returns.\n"
            "- EXPERIENCE ITEM: A third rule that exceeds the requested count.\n")
    assert parse_items(text, max_items=2) == ["Warranty questions: answer 24 months.",
                                              "Mention the form code R-12 for returns."]


@pytest.mark.parametrize("garbage", [
    None, "", "   \n\n", 12345, b"- EXPERIENCE ITEM: bytes are not text",
    "\x00\x01\x02 - EXPERIENCE ITEM: \x07\x08 control", "- EXPERIENCE ITEM: 12345 67890 !!!! ????",
    "- EXPERIENCE ITEM: " + "a" * 5000, "<|im_end|><|im_start|>assistant\n<|im_end|>",
    "\ud800 lone surrogate - EXPERIENCE ITEM: text", "- EXPERIENCE ITEM:" * 500,
])
def test_garbage_never_crashes_and_never_yields_junk(garbage: object) -> None:
    items = parse_items(garbage)
    assert all(looks_like_text(i) for i in items)
    assert not any("\x00" in i or "\x07" in i for i in items)


def test_random_token_soup_from_a_tiny_model_is_safe() -> None:
    """What a random 3M-parameter model emits: arbitrary unicode, markup fragments, partial markers."""
    rng = random.Random(7)
    alphabet = [chr(c) for c in range(32, 0x2FFF) if chr(c).isprintable()] + ["\n", "-", ":", "EXPERIENCE", "ITEM", "1."]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 400)))
        items = parse_items(text, max_items=2)
        assert len(items) <= 2
        assert all(looks_like_text(i) for i in items)


def test_clean_item_strips_markdown_quotes_and_numbering() -> None:
    assert clean_item("  2. **“Keep answers short.”** ") == "Keep answers short."
    assert clean_item("`Use   the form`  -") == "Use the form"
