"""PII detector quality and cost: recall/precision per type on the labelled set, and the latency capture
redaction adds to a request, against the same requests captured as-is (`keep`), in the same run.

    .venv/bin/python load/pii_bench.py [--requests 60] [--max-new-tokens 16] [--skip-server]

1. Quality: the shared detector over tests/data/pii_labelled.jsonl (>= 200 strings written for this:
   e-mails, phones in many formats, cards with spaces/dots/dashes, IBANs, IPs, names in context, SSNs,
   and negatives such as order numbers, prices, dates, versions, invalid-checksum card-like numbers).
   Recall: the detections of a type cover every letter/digit of a labelled entity; precision: a
   detection overlaps a labelled entity of its type (shared/privacy/evaluation.py).
2. Capture step: for each labelled string as a chat prompt (each distinct, so the scan cache never
   hits), the Interaction the server would capture is built and passed through `CapturePrivacy`
   with policy redact vs keep; the difference is the detector's cost per captured request.
3. End to end: a real inference server (tiny-random model, real gRPC on loopback, capture to its spool;
   Kafka is not needed: the sink spools while no broker answers) with two tenants, `redact` and `keep`;
   requests alternate between them (so load drift hits both alike); each prompt is distinct.
Prints tables and the ratio redact/keep of the mean request latency.

Business names and data (`APPRENTICE_BUSINESS_NAMES`, `APPRENTICE_BUSINESS_DATA`, shared/privacy/business.py),
between 1 and 2:
1b. Recall on the labelled set without and with a tenant's declared names (`BUSINESS`: staff names that
    share a first or last name with labelled end users, products, places): must be unchanged, since a
    declared name exempts only detections that lie inside one of its occurrences.
1c. Business text (`business_texts`: corrections and answers naming the tenant's staff, products and
    places next to end users' names, e-mails and phones): the share of business-name occurrences that
    survive redaction (must be all with the names declared; without, what the detector takes) and the
    recall on the end users' data in the same texts (must be unchanged).
1e. Public business data of every kind (`APPRENTICE_BUSINESS_DATA`): corrections and answers giving the business's
    names, phone numbers (in national and international spellings), e-mail, street and web addresses beside end
    users' names, phone numbers (one digit off the business's, same area code) and e-mails (a longer mailbox of the
    business's own domain): the share of declared values kept with the tenant's declaration, with none, and with
    another tenant's; the share of the users' data redacted (any type masking it) with and without the
    declaration; recall on the labelled set with the declaration (must be unchanged). Users' street addresses
    are counted apart: the detector has no street-address type.
1d. Disguises (load/pii_disguises.py): spelled-out at/dot, full-width and Indic/Arabic digits, mixed
    separators, dotted IBANs, values split across two messages, the OpenAI `user` field, session ids, and
    prose that reads like them: recall per form (any detection type masks it) and precision (a detection
    that touches no labelled value is a false alarm). Each conversation goes through what the capture
    runs on a request's messages (`Redactor.scan_conversation`: each message, and neighbours scanned
    joined); `--per-message` scans each message alone, as the capture did before it read conversations.
    The OpenAI `user` field is no longer captured at all (shared/security/pseudonyms.py): its rows say
    what a scan of the value would find, not what reaches a topic.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shared.privacy import NO_DATA, BusinessData, get_detector  # noqa: E402
from shared.privacy.detector import EMAIL, ENTITIES, PERSON, PHONE, Span  # noqa: E402
from shared.privacy.evaluation import Labelled, load_labelled, overall, score  # noqa: E402

LABELLED = Path(__file__).resolve().parents[1] / "tests" / "data" / "pii_labelled.jsonl"


def quality() -> list[str]:
    examples = load_labelled(LABELLED)
    det = get_detector()
    t0 = time.perf_counter()
    scores = score(det, examples)
    per_string_ms = (time.perf_counter() - t0) / len(examples) * 1000
    print(f"\n1) detector quality on {len(examples)} labelled strings "
          f"({sum(1 for e in examples if not e.entities)} without personal data)")
    print(f"{'type':<15}{'labelled':>9}{'found':>7}{'recall':>8}{'detected':>10}{'correct':>9}{'precision':>11}")
    for t in ENTITIES:
        s = scores[t]
        print(f"{t:<15}{s.labelled:>9}{s.true_pos:>7}{s.recall:>8.3f}{s.detected:>10}{s.correct:>9}{s.precision:>11.3f}")
    o = overall(scores)
    print(f"{'all (micro)':<15}{o.labelled:>9}{o.true_pos:>7}{o.recall:>8.3f}{o.detected:>10}{o.correct:>9}"
          f"{o.precision:>11.3f}")
    print(f"detector time per string: {per_string_ms:.1f} ms (uncached)")
    for t in ENTITIES:
        for m in scores[t].misses:
            print(f"  missed {t}: {m}")
        for m in scores[t].false_alarms:
            print(f"  false alarm {t}: {m}")
    return [e.text for e in examples]


# (staff member who speaks for the business, an end user who shares a word of that name)
STAFF_AND_USERS = [("Dana Reyes", "Dana Whitfield"), ("Tom Fischer", "Tom Becker"),
                   ("Maria Lindqvist", "Sven Lindqvist"), ("Priya Nair", "Priya Raman")]
PRODUCTS = ["Trailmate", "Summit Pass", "Brightwater Outfitters"]
PLACES = ["Harbor Point", "Bärengasse"]
BUSINESS = [*(staff for staff, _ in STAFF_AND_USERS), *PRODUCTS, *PLACES]
"""The tenant's declared names in 1b and 1c."""
PHONES = ["+1 415 555 0132", "+44 20 7946 0958", "+49 30 901820", "+33 1 42 68 53 00"]
TEMPLATES = [
    "This is {product} support: {staff} from our returns desk approves it.",
    "{staff} approves refunds over 200 dollars; ask her via the {product} app.",
    "Thanks, {user}! {staff} will call you back about your {product} order.",
    "Repaired bikes are collected at {place}; {staff} hands them over.",
    "Hi {user}, {staff} here from {product}. We wrote to {email}.",
    "Please tell {user} that {staff} at {place} has the parcel; reach them on {phone}.",
    "Regards,\n{staff}\n{product}",
    "{user} asked {staff} to move the {product} booking; confirm to {email}.",
    "Our store manager {staff} says {product} gift cards never expire.",
    "Kind regards, {staff}, {product} at {place}",
]


def business_texts() -> list[tuple[Labelled, list[tuple[int, int]]]]:
    """Each template with each (staff, user) pair: the text labelled with the end user's personal data
    (name, e-mail, phone) and the positions of the business's names in it."""
    out = []
    for template in TEMPLATES:
        for i, (staff, user) in enumerate(STAFF_AND_USERS):
            values = {"staff": staff, "user": user, "product": PRODUCTS[i % len(PRODUCTS)],
                      "place": PLACES[i % len(PLACES)], "email": user.lower().replace(" ", ".") + "@example.com",
                      "phone": PHONES[i]}
            text = template.format(**values)
            gold, business = [], []
            for key, entity in (("user", PERSON), ("email", EMAIL), ("phone", PHONE),
                                ("staff", ""), ("product", ""), ("place", "")):
                if "{" + key + "}" not in template:
                    continue
                start = text.index(values[key]) if key != "user" else _word_index(text, values[key])
                if entity:
                    gold.append(Span(start, start + len(values[key]), entity))
                else:
                    business.append((start, start + len(values[key])))
            out.append((Labelled(text, tuple(gold)), business))
    return out


def _word_index(text: str, value: str) -> int:
    """Where `value` occurs as whole words (the user's "Dana Whitfield" is not inside an e-mail)."""
    import re

    m = re.search(rf"(?<![\w.@]){re.escape(value)}(?![\w@])", text)
    assert m is not None, (value, text)
    return m.start()


def business_names_quality(examples: list[Labelled]) -> None:
    det = get_detector()
    declared = BusinessData.of(BUSINESS)
    print(f"\n1b) recall on personal data, without and with declared business names ({len(BUSINESS)}: "
          f"{', '.join(BUSINESS)})")
    print(f"{'type':<15}{'labelled':>9}{'recall':>9}{'declared':>10}")
    plain, named = score(det, examples), score(det, examples, declared)
    for t in ENTITIES:
        print(f"{t:<15}{plain[t].labelled:>9}{plain[t].recall:>9.3f}{named[t].recall:>10.3f}")
    print(f"{'all (micro)':<15}{overall(plain).labelled:>9}{overall(plain).recall:>9.3f}{overall(named).recall:>10.3f}"
          f"   {'unchanged' if all(plain[t].true_pos == named[t].true_pos for t in ENTITIES) else 'CHANGED'}")

    labelled = business_texts()
    print(f"\n1c) business text: {len(labelled)} corrections/answers naming the business's staff, products and "
          "places beside end users' names, e-mails and phones")
    print(f"{'names declared':<16}{'business names kept':>22}{'user data recall':>19}{'user names':>12}")
    for title, names in (("none", NO_DATA), ("all", declared)):
        kept = total = 0
        for ex, business in labelled:
            spans = names.keep(ex.text, det.find(ex.text))
            for a, b in business:
                total += 1
                kept += not any(s.start < b and a < s.end for s in spans)
        sc = score(det, [ex for ex, _ in labelled], names)
        o = overall(sc)
        print(f"{title:<16}{f'{kept}/{total} = {kept / total:.1%}':>22}{f'{o.true_pos}/{o.labelled} = {o.recall:.1%}':>19}"
              f"{sc[PERSON].recall:>12.3f}")
        for t in ENTITIES:
            for m in sc[t].misses:
                print(f"  missed {t}: {m}")


# 1e: (declared value, how the text writes it) per kind; the users' values are declared by no one
DECLARED_PHONES = [("+44 800 414 2277", ["0800 414 2277", "+44 800 414 2277", "0800-414-2277", "+44 (0)800 414 2277"]),
                   ("+1 415 555 0100", ["(415) 555-0100", "+1 415 555 0100", "415.555.0100", "+1-415-555-0100"]),
                   ("+49 30 9018 2000", ["030 9018 2000", "+49 30 9018 2000", "0049 30 9018 2000", "030/9018-2000"]),
                   ("+33 1 42 68 53 10", ["01 42 68 53 10", "+33 1 42 68 53 10", "01.42.68.53.10", "+33 (0)1 42 68 53 10"])]
DECLARED_EMAILS = ["found@trailmate.co.uk", "returns@brightwater-outfitters.com", "help@summitpass.io",
                   "kontakt@baerengasse-velo.ch"]
DECLARED_ADDRESSES = ["12 Harbour Road, Leith, Edinburgh EH6 6LX", "4 Quay Lane, Dana Point, CA 92629",
                      "Bärengasse 12, 8001 Zürich", "221B Baker Street, London NW1 6XE"]
DECLARED_URLS = ["https://www.trailmate.co.uk/returns", "brightwater-outfitters.com/contact?to=returns@brightwater-outfitters.com",
                 "summitpass.io/help", "https://baerengasse-velo.ch/werkstatt"]
USER_PHONES = ["07700 900123", "+44 800 414 2278", "(415) 555-0199", "030 9018 2001"]
USER_EMAILS = ["jane.roe@gmail.com", "lost.found@trailmate.co.uk", "tom.becker@brightwater-outfitters.com",
               "priya.raman@summitpass.io"]
USER_ADDRESSES = ["14 Elm Grove, Leeds LS6 2AB", "5 Quay Lane, Dana Point, CA 92629", "Bärengasse 14, 8001 Zürich",
                  "221A Baker Street, London NW1 6XE"]
OTHER_TENANT = {"names": ["Globex", "Hank Scorpio"], "phones": ["+1 212 555 0100"], "emails": ["help@globex.com"],
                "addresses": ["1 Globex Way, Cypress Creek"], "urls": ["https://globex.com"]}
DATA_TEMPLATES = [
    "Call customer service on {b_phone}. {u_name} left {u_phone} for a call back.",
    "Write to {b_email} about lost property; the customer wrote from {u_email}.",
    "This is {product} support: {staff} answers on {b_phone} and at {b_email}. {u_name} can reach us there.",
    "Bring the parcel to {b_addr}; {u_name} asked us to send it to {u_addr} instead.",
    "Returns are booked at {b_url}. {u_name}, we will confirm to {u_email} or {u_phone}.",
    "Regards,\n{staff}\n{product}, {b_addr}\nTel. {b_phone}\n{b_url}",
    "{staff} says: repairs go to {b_addr}, questions to {b_email}, never to {u_email}.",
    "Hi {u_name}, your number {u_phone} is on file; our hotline {b_phone} is open 8-20.",
]
_FIELD = __import__("re").compile(r"\{(\w+)\}")


def business_data_texts() -> list[tuple[str, dict[str, list[tuple[int, int]]], dict[str, list[tuple[int, int]]]]]:
    """Each template with each of four value sets: (text, {kind: declared value spans}, {kind: users' value
    spans}); spans come from building the text, never from searching it (the user's lost.found@... holds the
    business's found@...)."""
    out: list[tuple[str, dict[str, list[tuple[int, int]]], dict[str, list[tuple[int, int]]]]] = []
    for template in DATA_TEMPLATES:
        for i, (staff, user) in enumerate(STAFF_AND_USERS):
            values = {"staff": ("names", staff), "product": ("names", PRODUCTS[i % len(PRODUCTS)]),
                      "b_phone": ("phones", DECLARED_PHONES[i][1][(i + len(out)) % 4]),
                      "b_email": ("emails", DECLARED_EMAILS[i]), "b_addr": ("addresses", DECLARED_ADDRESSES[i]),
                      "b_url": ("urls", DECLARED_URLS[i]), "u_name": ("u_names", user),
                      "u_phone": ("u_phones", USER_PHONES[i]), "u_email": ("u_emails", USER_EMAILS[i]),
                      "u_addr": ("u_addresses", USER_ADDRESSES[i])}
            text, pos = "", 0
            declared: dict[str, list[tuple[int, int]]] = {}
            users: dict[str, list[tuple[int, int]]] = {}
            for m in _FIELD.finditer(template):
                text += template[pos:m.start()]
                kind, value = values[m.group(1)]
                target = users if kind.startswith("u_") else declared
                target.setdefault(kind.removeprefix("u_"), []).append((len(text), len(text) + len(value)))
                text += value
                pos = m.end()
            out.append((text + template[pos:], declared, users))
    return out


def business_data_quality(examples: list[Labelled]) -> None:
    det = get_detector()
    declared = BusinessData.of([*BUSINESS], phones=[p for p, _ in DECLARED_PHONES], emails=DECLARED_EMAILS,
                               addresses=DECLARED_ADDRESSES, urls=DECLARED_URLS)
    other = BusinessData.from_declaration(OTHER_TENANT)
    texts = business_data_texts()
    found = {text: det.find(text) for text, _, _ in texts}
    print(f"\n1e) public business data: {len(texts)} corrections/answers giving the business's names, phone numbers "
          "(national and international spellings), e-mail, street and web addresses beside end users' names, phone "
          "numbers and e-mails")

    def kept(b: BusinessData, kind: str) -> tuple[int, int]:
        k = n = 0
        for text, dec, _ in texts:
            spans = b.keep(text, found[text])
            for a, e in dec.get(kind, []):
                n += 1
                k += not any(s.start < e and a < s.end for s in spans)
        return k, n

    def redacted(b: BusinessData, kind: str) -> tuple[int, int]:
        r = n = 0
        for text, _, users in texts:
            masked = {i for s in b.keep(text, found[text]) for i in range(s.start, s.end)}
            for a, e in users.get(kind, []):
                n += 1
                r += all(i in masked for i in range(a, e) if text[i].isalnum())
        return r, n

    def pct(x: tuple[int, int]) -> str:
        return f"{x[0]}/{x[1]} = {x[0] / x[1]:.1%}" if x[1] else "-"

    print(f"{'kind':<11}{'declared kept: declared':>25}{'none':>16}{'other tenant':>16}"
          f"{'users redacted: declared':>27}{'none':>16}")
    tot: list[list[int]] = [[0, 0] for _ in range(5)]
    for kind in ("names", "phones", "emails", "addresses", "urls"):
        row = [kept(declared, kind), kept(NO_DATA, kind), kept(other, kind),
               redacted(declared, kind) if kind in ("names", "phones", "emails") else (0, 0),
               redacted(NO_DATA, kind) if kind in ("names", "phones", "emails") else (0, 0)]
        for acc, x in zip(tot, row, strict=True):
            acc[0] += x[0]
            acc[1] += x[1]
        print(f"{kind:<11}{pct(row[0]):>25}{pct(row[1]):>16}{pct(row[2]):>16}{pct(row[3]):>27}{pct(row[4]):>16}")
    all_ = [(a, b) for a, b in tot]
    print(f"{'all':<11}{pct(all_[0]):>25}{pct(all_[1]):>16}{pct(all_[2]):>16}{pct(all_[3]):>27}{pct(all_[4]):>16}")
    print(f"declared data kept: {all_[0][0] / all_[0][1]:.1%}; undeclared user data redacted: "
          f"{all_[3][0] / all_[3][1]:.1%} (without the declaration: kept {all_[1][0] / all_[1][1]:.1%}, "
          f"redacted {all_[4][0] / all_[4][1]:.1%})")
    addr = redacted(declared, "addresses")
    print(f"users' street addresses redacted (the detector has no street-address type; NER may read a place as a "
          f"name): {pct(addr)}")
    for text, dec, users in texts:
        spans = declared.keep(text, found[text])
        for kind, places in dec.items():
            for a, e in places:
                if any(s.start < e and a < s.end for s in spans):
                    print(f"  redacted declared {kind}: {text[a:e]!r} in {text!r}")
        masked = {i for s in spans for i in range(s.start, s.end)}
        for kind, places in users.items():
            for a, e in places:
                if kind != "addresses" and not all(i in masked for i in range(a, e) if text[i].isalnum()):
                    print(f"  kept user's {kind[:-1]}: {text[a:e]!r} in {text!r}")
    plain, with_data = score(det, examples), score(det, examples, declared)
    same = all(plain[t].true_pos == with_data[t].true_pos for t in ENTITIES)
    print(f"labelled set recall with this declaration: {overall(with_data).recall:.3f} (without: "
          f"{overall(plain).recall:.3f}) {'unchanged' if same else 'CHANGED'}")


def disguises(per_message: bool = False) -> None:
    from load.pii_disguises import CASES
    from shared.privacy.policy import Redactor

    redactor = Redactor(cache_size=0)
    per_form: dict[str, list[int]] = {}        # form -> [labelled, found, detected, false alarms]
    misses: list[str] = []
    for case in CASES:
        messages = list(case.messages)
        scans = ([redactor.scan(m, tenant="bench") for m in messages] if per_message else
                 redactor.scan_conversation(messages, ["user"] * len(messages), tenant="bench"))
        found = [list(scan.spans) for scan in scans]
        row = per_form.setdefault(case.form, [0, 0, 0, 0])
        gold: list[list[tuple[int, int]]] = [[] for _ in case.messages]
        for i, value in case.values:
            a = case.messages[i].index(value)
            gold[i].append((a, a + len(value)))
        for i, (text, spans) in enumerate(zip(case.messages, found, strict=True)):
            masked = {k for s in spans for k in range(s.start, s.end)}
            for a, b in gold[i]:
                row[0] += 1
                if all(k in masked for k in range(a, b) if text[k].isalnum()):
                    row[1] += 1
                else:
                    misses.append(f"  missed ({case.form}): {text[a:b]!r} in {text!r}")
            for s in spans:
                row[2] += 1
                if not any(s.start < b and a < s.end for a, b in gold[i]):
                    row[3] += 1
                    misses.append(f"  false alarm ({case.form}): {text[s.start:s.end]!r} ({s.entity}) in {text!r}")
    how = "each message alone" if per_message else "as one conversation"
    print(f"\n1d) disguised personal data ({len(CASES)} conversations, load/pii_disguises.py, {how})")
    print(f"{'form':<24}{'labelled':>9}{'found':>7}{'recall':>8}{'detected':>10}{'false':>7}{'precision':>11}")
    tot = [0, 0, 0, 0]
    for form, (n, tp, d, fa) in per_form.items():
        tot = [tot[0] + n, tot[1] + tp, tot[2] + d, tot[3] + fa]
        rec = f"{tp / n:.3f}" if n else "-"
        print(f"{form:<24}{n:>9}{tp:>7}{rec:>8}{d:>10}{fa:>7}{(d - fa) / d if d else 1.0:>11.3f}")
    n, tp, d, fa = tot
    print(f"{'all':<24}{n:>9}{tp:>7}{tp / n:>8.3f}{d:>10}{fa:>7}{(d - fa) / d if d else 1.0:>11.3f}")
    print("\n".join(misses))


def capture_step(texts: list[str], tok: Any) -> None:
    from services.inference.privacy import CapturePrivacy
    from services.inference.requests import interaction_event, prepare
    from services.inference.settings import InferenceSettings
    from shared.decoding.params import Sample
    from shared.privacy.policy import Redactor
    from shared.proto.apprentice.v1 import common_pb2, inference_pb2

    s = InferenceSettings(pod_id="bench", pii_tenant_policies="kept:keep")
    cp = CapturePrivacy(s, lambda: tok, Redactor(cache_size=0))    # no cache: every scan is paid
    answer = "Thanks for the details. The refund is on its way and should arrive in 3-5 working days."
    ids = tok(answer, add_special_tokens=False)["input_ids"]
    sample = Sample(token_ids=ids, text=answer, logprobs=[-0.5] * len(ids), logprobs_t1=[-0.5] * len(ids),
                    finish_reason="stop")

    def one(tenant: str, text: str) -> float:
        t0 = time.perf_counter()
        req = inference_pb2.GenerateRequest(messages=[common_pb2.ChatMessage(role="user", content=text)])
        p = prepare(req, tenant, s, tok, 2048, new_session_id="s")
        cp.screen_request(p)
        cp.redact_prompt(p)                 # before serving, as the edge does (services/inference/service.py)
        ev = interaction_event(p, sample, interaction_id="i", group_id="g", index=0, model="m", version="base",
                               canary=False, pod="bench", latency_ms=0.0, trace_id="t")
        cp.interactions(p, [ev])[0].SerializeToString()
        return (time.perf_counter() - t0) * 1000

    keep, redact = [], []
    for text in texts:                      # alternate, so drift in machine load hits both alike
        keep.append(one("kept", text))
        redact.append(one("acme", text))
    _table("2) capture step per request (prepare + screen + event + redaction), in-process", keep, redact)


def end_to_end(texts: list[str], n: int, max_new: int, model: str) -> None:
    from services.inference.client import InferenceClient
    from tests.helpers.inference import start_inference
    from tools.record_keys import ensure as ensure_record_keys
    from tools.record_keys import records_dir

    with tempfile.TemporaryDirectory(prefix="pii-bench-") as tmp:
        ensure_record_keys(records_dir(Path(tmp)))     # the server signs what it captures (its home is `tmp`)
        app = start_inference(Path(tmp), model=model, bootstrap="127.0.0.1:1", follow_updates=False,
                              heartbeat_interval_s=0, pii_tenant_policies="kept:keep")
        try:
            with InferenceClient(f"127.0.0.1:{app.port}") as c:
                for _ in range(3):
                    c.generate("warm up", max_new_tokens=max_new, tenant="kept")
                keep: list[float] = []
                redact: list[float] = []
                for i in range(n):
                    text = texts[i % len(texts)] + f" (request {i})"
                    for tenant, out in (("kept", keep), ("acme", redact)) if i % 2 else (("acme", redact), ("kept", keep)):
                        t0 = time.perf_counter()
                        c.generate([{"role": "user", "content": f"[{tenant}] {text}"}], max_new_tokens=max_new,
                                   temperature=0.0, tenant=tenant)
                        out.append((time.perf_counter() - t0) * 1000)
        finally:
            app.stop(2)
    _table(f"3) end to end: Generate over gRPC, {model}, {max_new} new tokens, capture to spool, {n} requests "
           "per policy", keep, redact)


def _table(title: str, keep: list[float], redact: list[float]) -> None:
    def row(name: str, xs: list[float]) -> str:
        q = statistics.quantiles(xs, n=20)
        return f"{name:<22}{statistics.mean(xs):>10.2f}{statistics.median(xs):>10.2f}{q[18]:>10.2f}"

    print(f"\n{title}")
    print(f"{'policy':<22}{'mean ms':>10}{'p50 ms':>10}{'p95 ms':>10}")
    print(row("keep (baseline)", keep))
    print(row("redact", redact))
    added = statistics.mean(redact) - statistics.mean(keep)
    print(f"added by redaction: {added:+.2f} ms per request (p50 {statistics.median(redact) - statistics.median(keep):+.2f} ms); "
          f"ratio redact/keep = {statistics.mean(redact) / statistics.mean(keep):.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=60, help="end-to-end requests per policy")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--skip-server", action="store_true", help="only the detector and the capture step")
    ap.add_argument("--disguises-only", action="store_true", help="only section 1d (disguised personal data)")
    ap.add_argument("--business-only", action="store_true", help="only sections 1b, 1c and 1e (business names and data)")
    ap.add_argument("--per-message", action="store_true",
                    help="1d: scan each message alone (the capture before conversations were read together)")
    args = ap.parse_args()
    print(f"pii_bench {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {platform.node()} ({platform.machine()}, "
          f"{__import__('os').cpu_count()} CPUs, Python {platform.python_version()})")
    t0 = time.perf_counter()
    get_detector()
    print(f"detector build (Presidio + spaCy en_core_web_sm): {time.perf_counter() - t0:.1f} s, once per process")
    if args.business_only:
        business_names_quality(load_labelled(LABELLED))
        business_data_quality(load_labelled(LABELLED))
        return
    disguises(args.per_message)
    if args.disguises_only:
        return
    texts = quality()
    business_names_quality(load_labelled(LABELLED))
    business_data_quality(load_labelled(LABELLED))
    from shared.models import load_tokenizer

    tok = load_tokenizer(args.model)
    capture_step(texts, tok)
    if not args.skip_server:
        end_to_end(texts, args.requests, args.max_new_tokens, args.model)


if __name__ == "__main__":
    main()
