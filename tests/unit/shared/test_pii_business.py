"""A tenant's declared public business data (names, phone numbers, e-mail, street and web addresses) survives
redaction for that tenant only; end users' personal data does not (real detector)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.privacy import (
    NO_DATA,
    BusinessData,
    Redactor,
    Span,
    get_detector,
    parse_business_data,
    parse_business_names,
)
from shared.privacy.business import MAX_NAME_CHARS, MAX_NAMES_PER_TENANT
from shared.privacy.detector import EMAIL, PERSON, PHONE
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
    kept = redactor.scan(CORRECTION, tenant="t", business=BusinessData.of(ACME))
    assert kept.redacted == ("This is Trailmate support: Dana Whitfield from our returns desk approves it. "
                             "<PERSON> asked us to write to <EMAIL_ADDRESS>.")
    assert kept.types == [EMAIL, PERSON] and kept.names() == {"Dana", "Smith"}


def test_structured_data_is_redacted_even_with_a_declared_word(redactor: Redactor) -> None:
    text = "Write to dana.whitfield@trailmate.com or call Dana Whitfield at +1 415 555 0132, card 4111.1111.1111.1111."
    assert redactor.scan(text, tenant="t", business=BusinessData.of(ACME)).redacted == (
        "Write to <EMAIL_ADDRESS> or call Dana Whitfield at <PHONE_NUMBER>, card <CREDIT_CARD>.")


def test_whole_words_any_case_and_nothing_beyond_the_name(redactor: Redactor) -> None:
    b = BusinessData.of(ACME)
    assert redactor.scan("This is TRAILMATE support", tenant="t", business=b).redacted == "This is TRAILMATE support"
    assert redactor.scan("This is Trailmates support", tenant="t", business=b).redacted == "This is <PERSON> support"
    assert redactor.scan("I'm Dana Whitfield-Smith, please help", tenant="t", business=b).redacted == "I'm <PERSON>, please help"
    assert redactor.scan("Hi, I am Dana Smith", tenant="t", business=b).redacted == "Hi, I am <PERSON>"
    assert redactor.scan("Regards,\nDana Whitfield\nTrailmate", tenant="t", business=b).redacted == \
        "Regards,\nDana Whitfield\nTrailmate"     # NER reads the sign-off as one name


def test_an_answer_keeps_the_staff_name_that_shares_a_word_with_the_user(redactor: Redactor) -> None:
    answer = "Thanks, Dana! Dana Whitfield will call you."
    assert redactor.scan_answer(answer, {"Dana", "Smith"}, BusinessData.of(ACME), tenant="t").redacted == \
        "Thanks, <PERSON>! Dana Whitfield will call you."
    assert redactor.scan_answer(answer, {"Dana", "Smith"}, tenant="t").redacted == "Thanks, <PERSON>! <PERSON> Whitfield will call you."


def test_the_cache_is_keyed_by_the_names_too(redactor: Redactor) -> None:
    """One process serves many tenants: a scan cached under tenant A's names must not answer tenant B."""
    r = Redactor(cache_size=8)
    a = BusinessData.of(ACME)
    assert "Dana Whitfield" in r.scan(CORRECTION, tenant="t", business=a).redacted
    assert "Dana Whitfield" not in r.scan(CORRECTION, tenant="t").redacted
    assert "Dana Whitfield" not in r.scan(CORRECTION, tenant="t", business=BusinessData.of(["Brightwater"])).redacted
    assert "Dana Whitfield" in r.scan(CORRECTION, tenant="t", business=a).redacted
    assert a.key != NO_DATA.key == b"" and BusinessData.of(["dana whitfield", "TRAILMATE"]).key == a.key


def test_keep_only_drops_names_inside_an_occurrence() -> None:
    b = BusinessData.of(["Harbor Point", "Point Reyes"])
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
    assert "Dana Whitfield" in redactor.scan(CORRECTION, tenant="t", business=s.business_data_for("acme")).redacted
    other = redactor.scan(CORRECTION, tenant="t", business=s.business_data_for("globex")).redacted
    assert "Trailmate" not in other and "Whitfield" not in other
    assert s.business_data_for("initech") is NO_DATA or not s.business_data_for("initech")


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
    names = BusinessData.of(["Dana Reyes", "Tom Fischer", "Maria Lindqvist", "Priya Nair", "Trailmate",
                              "Harbor Point"])
    plain, named = score(get_detector(), examples), score(get_detector(), examples, names)
    assert {t: s.true_pos for t, s in named.items()} == {t: s.true_pos for t, s in plain.items()}
    assert named[PERSON].labelled >= 40


# --- public business data of every kind (APPRENTICE_BUSINESS_DATA): exactly the declared values ---------
SUPPORT_LINE, LOST_PROPERTY = "+44 800 414 2277", "found@trailmate-outfitters.co.uk"
ACME_DATA = '{"acme": {"phones": ["+44 800 414 2277"], "emails": ["found@trailmate-outfitters.co.uk"]}, ' \
            '"globex": {"phones": ["+1 415 555 0132"]}}'
BACKEND = ("Call customer service on 0800 414 2277. Write to found@trailmate-outfitters.co.uk about lost "
           "property. The customer's own number is 07700 900123 and her mail jane.roe@gmail.com.")


def test_declared_phone_and_email_are_kept_for_their_tenant_only(monkeypatch: pytest.MonkeyPatch,
                                                                 redactor: Redactor) -> None:
    """The backend's corrections that taught nothing on the second task ('Call customer service on 0800 414
    2277', 'Write to found@...'): kept for the tenant that declared them, redacted for every other tenant, and
    the end user's own number and address in the same text redacted for all."""
    monkeypatch.setenv("APPRENTICE_BUSINESS_DATA", ACME_DATA)
    s = CommonSettings()
    assert s.business_data == {"acme": {"phones": [SUPPORT_LINE], "emails": [LOST_PROPERTY]},
                               "globex": {"phones": ["+1 415 555 0132"]}}
    assert redactor.scan(BACKEND, tenant="acme", business=s.business_data_for("acme")).redacted == (
        "Call customer service on 0800 414 2277. Write to found@trailmate-outfitters.co.uk about lost property. "
        "The customer's own number is <PHONE_NUMBER> and her mail <EMAIL_ADDRESS>.")
    for tenant in ("globex", "initech"):
        assert redactor.scan(BACKEND, tenant=tenant, business=s.business_data_for(tenant)).redacted == (
            "Call customer service on <PHONE_NUMBER>. Write to <EMAIL_ADDRESS> about lost property. "
            "The customer's own number is <PHONE_NUMBER> and her mail <EMAIL_ADDRESS>.")
    assert not s.business_data_for("initech")


def test_names_and_data_declared_apart_are_one_declaration(monkeypatch: pytest.MonkeyPatch, redactor: Redactor) -> None:
    monkeypatch.setenv("APPRENTICE_BUSINESS_NAMES", '{"acme": ["Trailmate", "Dana Whitfield"]}')
    monkeypatch.setenv("APPRENTICE_BUSINESS_DATA", '{"acme": {"names": ["Harbor Point"], "phones": ["0800 414 2277"]}}')
    b = CommonSettings().business_data_for("acme")
    assert b.names == ("Trailmate", "Dana Whitfield", "Harbor Point") and b.phones == ("0800 414 2277",)
    text = "Dana Whitfield at Harbor Point answers 0800 414 2277 for Trailmate."
    assert redactor.scan(text, tenant="acme", business=b).redacted == text


@pytest.mark.parametrize(("written", "kept"), [
    ("0800 414 2277", True), ("0800-414-2277", True), ("(0800) 414 2277", True), ("08004142277", True),
    ("+44 800 414 2277", True), ("+448004142277", True), ("0044 800 414 2277", True), ("+44 (0)800 414 2277", True),
    ("+44 800.414.2277", True), ("０８００ ４１４ ２２７７", True),
    ("0800 414 2278", False),        # another number
    ("0800 414 22771", False),       # a longer one that starts with it
    ("+1 800 414 2277", False),      # the same digits in another country
    ("+49 800 414 2277", False),
])
def test_a_phone_number_declared_internationally_is_kept_in_every_spelling(redactor: Redactor, written: str,
                                                                           kept: bool) -> None:
    b = BusinessData.of(phones=[SUPPORT_LINE])
    text = f"Call customer service on {written} today."
    got = redactor.scan(text, tenant="acme", business=b)
    assert redactor.scan(text, tenant="acme").types == ["PHONE_NUMBER"]        # the detector reads each as a phone
    assert (got.redacted == text) is kept, got.redacted


def test_a_phone_number_declared_nationally_is_kept_in_national_form_only(redactor: Redactor) -> None:
    b = BusinessData.of(phones=["0800 414 2277"])
    assert redactor.scan("Call 0800-414-2277 now", tenant="t", business=b).redacted == "Call 0800-414-2277 now"
    # which country a national number belongs to is not declared: the international spelling stays redacted
    assert redactor.scan("Call +44 800 414 2277 now", tenant="t", business=b).redacted == "Call <PHONE_NUMBER> now"
    assert BusinessData.of(phones=["0800 414 2277"]).key == BusinessData.of(phones=["0800-414-2277"]).key
    assert BusinessData.of(phones=["0800 414 2277"]).key != BusinessData.of(phones=["+44 800 414 2277"]).key


def test_an_email_is_kept_in_any_case_but_never_inside_a_longer_address(redactor: Redactor) -> None:
    b = BusinessData.of(emails=[LOST_PROPERTY])
    text = ("Write to FOUND@Trailmate-Outfitters.co.uk, not lost.found@trailmate-outfitters.co.uk, "
            "found@trailmate-outfitters.co.uk.evil.com or found@trailmate-outfitters.com.")
    assert redactor.scan(text, tenant="t", business=b).redacted == (
        "Write to FOUND@Trailmate-Outfitters.co.uk, not <EMAIL_ADDRESS>, <EMAIL_ADDRESS> or <EMAIL_ADDRESS>.")
    # a declared e-mail's words make no name of the same words a business name
    assert redactor.scan("I am Found Trailmate", tenant="t", business=b).redacted == "I am <PERSON>"


def test_street_and_web_addresses_keep_what_the_detector_reads_inside_them(redactor: Redactor) -> None:
    b = BusinessData.of(addresses=["4 Quay Lane, Dana Point, CA 92629"],
                        urls=["https://trailmate.com/returns?contact=returns@trailmate.com"])
    for shop, ner in (("Send it to Brightwater Outfitters, 4 Quay Lane, Dana Point, CA 92629.", "Dana Point"),
                      ("Our shop: 4 QUAY LANE, Dana Point, CA 92629.", "Dana Point"),           # any case
                      ("Send it to Brightwater Outfitters at 4 Quay Lane Dana Point, CA 92629.", "Lane Dana Point")):
        assert redactor.scan(shop, tenant="t").redacted == shop.replace(ner, "<PERSON>")   # NER's reading
        assert redactor.scan(shop, tenant="t", business=b).redacted == shop
    # a user who names the town alone, or lives elsewhere on the street, is not the declared address
    assert redactor.scan("I live in Dana Point, CA 92629.", tenant="t", business=b).redacted == \
        "I live in <PERSON>, CA 92629."
    url = "Returns: https://trailmate.com/returns?contact=returns@trailmate.com"
    assert redactor.scan(url, tenant="t").redacted == "Returns: https://<EMAIL_ADDRESS>"
    assert redactor.scan(url, tenant="t", business=b).redacted == url
    assert redactor.scan("Returns: www.trailmate.com/returns?contact=returns@trailmate.com/", tenant="t",
                         business=b).redacted == "Returns: www.trailmate.com/returns?contact=returns@trailmate.com/"
    other = "Returns: https://trailmate.com/returns?contact=jane.roe@gmail.com"
    assert redactor.scan(other, tenant="t", business=b).redacted == "Returns: https://<EMAIL_ADDRESS>"


def test_a_declaration_is_part_of_the_cache_key() -> None:
    r = Redactor(cache_size=8)
    a = BusinessData.of(phones=[SUPPORT_LINE])
    assert "0800 414 2277" in r.scan(BACKEND, tenant="t", business=a).redacted
    assert "0800 414 2277" not in r.scan(BACKEND, tenant="t").redacted
    assert "0800 414 2277" not in r.scan(BACKEND, tenant="t", business=BusinessData.of(["Trailmate"])).redacted
    assert a.key != BusinessData.of(emails=[SUPPORT_LINE.replace(" ", "") + "@x.co.uk"]).key


@pytest.mark.parametrize(("value", "needle"), [
    ('{"acme": {"phone": ["0800 414 2277"]}}', "unknown kind 'phone'"),
    ('{"acme": {"phones": ["2277"]}}', "has 4 digits"),
    ('{"acme": {"phones": ["0800 CALL NOW"]}}', "only digits"),
    ('{"acme": {"phones": "0800 414 2277"}}', "list of strings"),
    ('{"acme": {"emails": ["*@trailmate.co.uk"]}}', "not one address"),
    ('{"acme": {"emails": ["found at trailmate"]}}', "not one address"),
    ('{"acme": {"urls": ["trailmate.*"]}}', "write each address out"),
    ('{"acme": {"urls": ["not a url"]}}', "contains ' '"),
    ('{"acme": {"addresses": ["Leith"]}}', "at least two words"),
    ('{"acme": {"addresses": ["12 (Harbour) Road"]}}', "matched literally"),
    ('{"acme": ["0800 414 2277"]}', "expected an object"),
    ("0800 414 2277", "not JSON"),
])
def test_bad_business_data_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch, value: str,
                                                          needle: str) -> None:
    monkeypatch.setenv("APPRENTICE_BUSINESS_DATA", value)
    with pytest.raises(ValueError, match="APPRENTICE_BUSINESS_DATA") as e:
        CommonSettings()
    assert needle in str(e.value)


def test_business_data_bounds_and_empty() -> None:
    many = [f"+44 20 7946 {i:04d}" for i in range(MAX_NAMES_PER_TENANT + 1)]
    with pytest.raises(ValueError, match=f"at most {MAX_NAMES_PER_TENANT}"):
        parse_business_data({"acme": {"phones": many}})
    assert parse_business_data({"acme": {"phones": ["0800 414 2277", "0800-414-2277"], "emails": []}}) == \
        {"acme": {"phones": ("0800 414 2277",)}}
    assert CommonSettings(business_data="").business_data == {}     # type: ignore[arg-type]  # compose's ${VAR:-}


def test_declared_data_leaves_recall_on_the_labelled_set_unchanged() -> None:
    """Declared phones and e-mails beside labelled end users' ones (other numbers, other mailboxes of the
    same domains): not one labelled entity is lost (load/pii_bench.py 1e)."""
    examples = load_labelled(LABELLED)
    data = BusinessData.of(phones=[SUPPORT_LINE, "+1 415 555 0100", "+49 30 901820"],
                           emails=[LOST_PROPERTY, "support@example.com", "help@acme.co.uk"],
                           urls=["https://example.com/help"], addresses=["4 Quay Lane, Dana Point, CA 92629"])
    plain, declared = score(get_detector(), examples), score(get_detector(), examples, data)
    assert {t: s.true_pos for t, s in declared.items()} == {t: s.true_pos for t, s in plain.items()}
    assert declared[PHONE].labelled >= 20 and declared[EMAIL].labelled >= 20
