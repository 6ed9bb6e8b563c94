"""A tenant's declared business names survive redaction; end users' personal data does not (real detector)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.privacy import NO_NAMES, BusinessNames, Redactor, Span, get_detector, parse_business_names
from shared.privacy.business import MAX_NAME_CHARS, MAX_NAMES_PER_TENANT
from shared.privacy.detector import EMAIL, PERSON
from shared.privacy.evaluation import load_labelled, score
from shared.settings import CommonSettings

LABELLED = Path(__file__).resolve().parents[2] / "data" / "pii_labelled.jsonl"

ACME = ["Trailmate", "Dana Whitfield"]
CORRECTION = ("This is Trailmate support: Dana Whitfield from our returns desk approves it. "
              "Dana Smith asked us to write to dana.smith@example.com.")


@pytest.fixture(scope="module")
def redactor() -> Redactor:
    return Redactor()


def test_a_correction_keeps_the_product_and_the_staff_member_but_not_the_user(redactor: Redactor) -> None:
    # the detector reads all three as people: without declared names the facts are lost
    assert redactor.scan(CORRECTION, tenant="t").redacted == ("This is <PERSON> support: <PERSON> from our returns desk approves "
                                                  "it. <PERSON> asked us to write to <EMAIL_ADDRESS>.")
    kept = redactor.scan(CORRECTION, tenant="t", business=BusinessNames.of(ACME))
    assert kept.redacted == ("This is Trailmate support: Dana Whitfield from our returns desk approves it. "
                             "<PERSON> asked us to write to <EMAIL_ADDRESS>.")
    assert kept.types == [EMAIL, PERSON] and kept.names() == {"Dana", "Smith"}


def test_structured_data_is_redacted_even_with_a_declared_word(redactor: Redactor) -> None:
    text = "Write to dana.whitfield@trailmate.com or call Dana Whitfield at +1 415 555 0132, card 4111.1111.1111.1111."
    assert redactor.scan(text, tenant="t", business=BusinessNames.of(ACME)).redacted == (
        "Write to <EMAIL_ADDRESS> or call Dana Whitfield at <PHONE_NUMBER>, card <CREDIT_CARD>.")


def test_whole_words_any_case_and_nothing_beyond_the_name(redactor: Redactor) -> None:
    b = BusinessNames.of(ACME)
    assert redactor.scan("This is TRAILMATE support", tenant="t", business=b).redacted == "This is TRAILMATE support"
    assert redactor.scan("This is Trailmates support", tenant="t", business=b).redacted == "This is <PERSON> support"
    assert redactor.scan("I'm Dana Whitfield-Smith, please help", tenant="t", business=b).redacted == "I'm <PERSON>, please help"
    assert redactor.scan("Hi, I am Dana Smith", tenant="t", business=b).redacted == "Hi, I am <PERSON>"
    assert redactor.scan("Regards,\nDana Whitfield\nTrailmate", tenant="t", business=b).redacted == \
        "Regards,\nDana Whitfield\nTrailmate"     # NER reads the sign-off as one name


def test_an_answer_keeps_the_staff_name_that_shares_a_word_with_the_user(redactor: Redactor) -> None:
    answer = "Thanks, Dana! Dana Whitfield will call you."
    assert redactor.scan_answer(answer, {"Dana", "Smith"}, BusinessNames.of(ACME), tenant="t").redacted == \
        "Thanks, <PERSON>! Dana Whitfield will call you."
    assert redactor.scan_answer(answer, {"Dana", "Smith"}, tenant="t").redacted == "Thanks, <PERSON>! <PERSON> Whitfield will call you."


def test_the_cache_is_keyed_by_the_names_too(redactor: Redactor) -> None:
    """One process serves many tenants: a scan cached under tenant A's names must not answer tenant B."""
    r = Redactor(cache_size=8)
    a = BusinessNames.of(ACME)
    assert "Dana Whitfield" in r.scan(CORRECTION, tenant="t", business=a).redacted
    assert "Dana Whitfield" not in r.scan(CORRECTION, tenant="t").redacted
    assert "Dana Whitfield" not in r.scan(CORRECTION, tenant="t", business=BusinessNames.of(["Brightwater"])).redacted
    assert "Dana Whitfield" in r.scan(CORRECTION, tenant="t", business=a).redacted
    assert a.key != NO_NAMES.key == b"" and BusinessNames.of(["dana whitfield", "TRAILMATE"]).key == a.key


def test_keep_only_drops_names_inside_an_occurrence() -> None:
    b = BusinessNames.of(["Harbor Point", "Point Reyes"])
    text = "Meet at Harbor  Point Reyes's café, ask Reyes."
    assert [text[a:e] for a, e in b.occurrences(text)] == ["Harbor  Point", "Point Reyes"]   # overlapping, both
    spans = [Span(8, 29, PERSON), Span(16, 29, PERSON), Span(16, 34, PERSON), Span(40, 45, PERSON),
             Span(8, 13, EMAIL)]
    # names written next to each other and a possessive are the business's; a word outside every
    # occurrence ("café"), a lone word of a name ("Reyes") and any non-name type are still redacted
    assert [text[s.start:s.end] for s in b.keep(text, spans)] == ["Point Reyes's café", "Reyes", "Harbo"]


def test_tenant_a_names_do_not_exempt_tenant_b(monkeypatch: pytest.MonkeyPatch, redactor: Redactor) -> None:
    monkeypatch.setenv("APPRENTICE_BUSINESS_NAMES", '{"acme": ["Trailmate", "Dana  Whitfield"], "globex": ["Hank"]}')
    s = CommonSettings()
    assert s.business_names == {"acme": ["Trailmate", "Dana Whitfield"], "globex": ["Hank"]}
    assert "Dana Whitfield" in redactor.scan(CORRECTION, tenant="t", business=s.business_names_for("acme")).redacted
    other = redactor.scan(CORRECTION, tenant="t", business=s.business_names_for("globex")).redacted
    assert "Trailmate" not in other and "Whitfield" not in other
    assert s.business_names_for("initech") is NO_NAMES or not s.business_names_for("initech")


@pytest.mark.parametrize(("value", "needle"), [
    ('{"acme": [""]}', "may not be empty"),
    ('{"acme": ["   "]}', "may not be empty"),
    ('{"acme": ["*"]}', "matched literally"),
    ('{"acme": [".*"]}', "matched literally"),
    ('{"acme": ["Trail?"]}', "matched literally"),
    ('{"acme": ["<PERSON>"]}', "matched literally"),
    ('{"acme": ["..."]}', "no letter"),
    ('{"acme": ["X"]}', "shorter than 2"),
    ('{"acme": ["' + "x" * (MAX_NAME_CHARS + 1) + '"]}', "longer than"),
    ('{"acme": "Trailmate"}', "list of strings"),
    ('{"acme": [3]}', "must be a string"),
    ('{"": ["Trailmate"]}', "tenant"),
    ('["Trailmate"]', "object"),
    ("Trailmate", "not JSON"),
])
def test_bad_settings_are_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch, value: str, needle: str) -> None:
    monkeypatch.setenv("APPRENTICE_BUSINESS_NAMES", value)
    with pytest.raises(ValueError, match="APPRENTICE_BUSINESS_NAMES") as e:
        CommonSettings()
    assert needle in str(e.value)


def test_bounds_and_empty() -> None:
    many = [f"Product {i}" for i in range(MAX_NAMES_PER_TENANT + 1)]
    with pytest.raises(ValueError, match=f"at most {MAX_NAMES_PER_TENANT}"):
        parse_business_names({"acme": many})
    assert parse_business_names({"acme": ["Trailmate", "trailmate", " Trailmate "]}) == {"acme": ("Trailmate",)}
    assert CommonSettings(business_names="").business_names == {}     # type: ignore[arg-type]  # compose's ${VAR:-}


def test_declared_names_leave_recall_on_the_labelled_set_unchanged() -> None:
    """Staff names sharing a first or last name with labelled end users (Dana Whitfield, Tom Becker, Sven
    Lindqvist, Priya Raman), products and places: not one labelled entity is lost (load/pii_bench.py 1b)."""
    examples = load_labelled(LABELLED)
    names = BusinessNames.of(["Dana Reyes", "Tom Fischer", "Maria Lindqvist", "Priya Nair", "Trailmate",
                              "Harbor Point"])
    plain, named = score(get_detector(), examples), score(get_detector(), examples, names)
    assert {t: s.true_pos for t, s in named.items()} == {t: s.true_pos for t, s in plain.items()}
    assert named[PERSON].labelled >= 40
