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

Business names (`APPRENTICE_BUSINESS_NAMES`, shared/privacy/business.py), between 1 and 2:
1b. Recall on the labelled set without and with a tenant's declared names (`BUSINESS`: staff names that
    share a first or last name with labelled end users, products, places): must be unchanged, since a
    declared name exempts only detections that lie inside one of its occurrences.
1c. Business text (`business_texts`: corrections and answers naming the tenant's staff, products and
    places next to end users' names, e-mails and phones): the share of business-name occurrences that
    survive redaction (must be all with the names declared; without, what the detector takes) and the
    recall on the end users' data in the same texts (must be unchanged).
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

    with tempfile.TemporaryDirectory(prefix="pii-bench-") as tmp:
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
    ap.add_argument("--per-message", action="store_true",
                    help="1d: scan each message alone (the capture before conversations were read together)")
    args = ap.parse_args()
    print(f"pii_bench {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {platform.node()} ({platform.machine()}, "
          f"{__import__('os').cpu_count()} CPUs, Python {platform.python_version()})")
    t0 = time.perf_counter()
    get_detector()
    print(f"detector build (Presidio + spaCy en_core_web_sm): {time.perf_counter() - t0:.1f} s, once per process")
    disguises(args.per_message)
    if args.disguises_only:
        return
    texts = quality()
    business_names_quality(load_labelled(LABELLED))
    from shared.models import load_tokenizer

    tok = load_tokenizer(args.model)
    capture_step(texts, tok)
    if not args.skip_server:
        end_to_end(texts, args.requests, args.max_new_tokens, args.model)


if __name__ == "__main__":
    main()
