"""`apprentice grader rules set|list|delete`: a tenant's grading rules, changed while the grader runs.

The rules go to the compacted topic `apprentice.grader-rules.v1` (rulebook.py says what a record holds and
how the grader checks it); every grader worker follows it and applies a rule within about one tick.

    apprentice grader rules set --tenant acme --task billing --kpi resolved --window 30s
    apprentice grader rules set --tenant acme --task billing --file rules.yaml
    apprentice grader rules list [--json]
    apprentice grader rules delete --tenant acme --task billing

`--file` holds one `tasks:` entry of the grader config (shared/grading/schema.py), without tenant and task
or with the same ones. The rules are validated with the grader's schema before anything is written. The
record carries the record signature of the `operator` principal (its private key in
APPRENTICE_RECORD_KEYS_DIR, shared/kafka/signing.py); the grader applies only records the operator signed.
Exit codes: 0 ok, 1 refused (the message says why), 2 bad usage, 3 the broker is unreachable.
"""

from __future__ import annotations

import argparse
import getpass
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from services.grader.core.rulebook import OPERATOR, RuleRecord, RuleRefused, new_record, rule_key
from shared.contracts.topics import contract_name
from shared.contracts.validation import KafkaHeaders
from shared.kafka.admin import broker_answers, ensure_topics
from shared.kafka.durability import durable_producer
from shared.kafka.reader import ReadTimeout, TopicMissing, read_topic_to_end
from shared.kafka.security import librdkafka_config
from shared.kafka.signing import SigningKeyMissing
from shared.kafka.trust import record_signer
from shared.settings import CommonSettings
from shared.unreachable import EXIT_UNREACHABLE, KAFKA, unreachable


def duration(text: str) -> float:
    """`30`, `30s`, `5m`, `2h`, `1d` --> seconds."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhd]?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 30s, 5m or 2h")
    return float(m[1]) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m[2]]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="apprentice grader", description="The grader's rules, set at run time.")
    sub = p.add_subparsers(dest="what", required=True, metavar="rules")
    rules = sub.add_parser("rules", help="set, list or delete a tenant's grading rules")
    cmds = rules.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def target(a: argparse.ArgumentParser) -> None:
        a.add_argument("--tenant", required=True, help="the tenant ('*' = every tenant, with --all-tenants)")
        a.add_argument("--task", default="*", help="the task (default '*': every task of the tenant)")
        a.add_argument("--all-tenants", action="store_true", help="allow --tenant '*'")

    s = cmds.add_parser("set", help="add or replace the rules of a tenant (and task)")
    target(s)
    s.add_argument("--file", type=Path, help="YAML/JSON: one `tasks:` entry of the grader config")
    s.add_argument("--kpi", action="append", default=[], metavar="NAME",
                   help="reward the KPI NAME (values 0..1 -> reward 0..1); repeatable")
    s.add_argument("--feedback", action="append", default=[], choices=["thumbs", "rating", "correction"],
                   help="reward this user feedback kind too; repeatable")
    s.add_argument("--window", type=duration, default=None, help="feedback window, e.g. 30s, 10m (default 300s)")
    s.add_argument("--operator", default="", help="who sets it (default: your user name; the key id when signed)")
    d = cmds.add_parser("delete", help="remove a runtime rule (the config file's rules apply again)")
    target(d)
    d.add_argument("--operator", default="")
    ls = cmds.add_parser("list", help="the runtime rules in effect")
    ls.add_argument("--json", action="store_true")
    return p


def inline_rules(kpis: list[str], feedback: list[str], window: float | None) -> dict[str, Any]:
    """The common case as a TaskGraders document: every named KPI and feedback kind rewarded; the first
    feedback ends the wait (later feedback revises the record)."""
    graders: list[dict[str, Any]] = [{"name": re.sub(r"[^A-Za-z0-9_.\-]", "_", k), "type": "kpi", "kpi": k,
                                      "success": n == 0} for n, k in enumerate(kpis)]
    graders += [{"name": kind, "type": "feedback", "kind": kind, "success": not graders and n == 0}
                for n, kind in enumerate(feedback)]
    doc: dict[str, Any] = {"emit_when": "any_feedback", "graders": graders}
    if window is not None:
        doc["feedback_window_s"] = window
    return doc


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)

    common = CommonSettings()
    try:
        if ns.cmd == "list":
            return _list(common, as_json=ns.json)
        if ns.cmd == "set":
            if ns.file is not None and (ns.kpi or ns.feedback):
                print("apprentice grader: give either --file or --kpi/--feedback, not both", file=sys.stderr)
                return 2
            if ns.file is not None:
                try:
                    doc = yaml.safe_load(ns.file.read_text())
                except (OSError, yaml.YAMLError) as e:
                    print(f"apprentice grader: cannot read {ns.file}: {e}", file=sys.stderr)
                    return 2
                if isinstance(doc, dict) and ns.window is not None:
                    doc["feedback_window_s"] = ns.window
            elif ns.kpi or ns.feedback:
                doc = inline_rules(ns.kpi, ns.feedback, ns.window)
            else:
                print("apprentice grader: say what to reward: --file rules.yaml, or --kpi NAME / --feedback KIND",
                      file=sys.stderr)
                return 2
            rec = new_record(ns.tenant, ns.task, operator=ns.operator or getpass.getuser(), rules=doc,
                             wildcard=ns.all_tenants)
        else:
            rec = new_record(ns.tenant, ns.task, operator=ns.operator or getpass.getuser(), rules=None,
                             deleted=True, wildcard=ns.all_tenants)
    except RuleRefused as e:
        print(f"apprentice grader: {e}", file=sys.stderr)
        return 1
    return _write(common, rec)


def _write(common: Any, rec: RuleRecord) -> int:
    if not broker_answers(common.kafka_bootstrap, security=common):
        print(f"apprentice grader: {unreachable(KAFKA, common.kafka_bootstrap)}", file=sys.stderr)
        return EXIT_UNREACHABLE
    try:  # the grader applies only rule records signed by the operator principal (rulebook.py)
        signer = record_signer(common, OPERATOR)
    except SigningKeyMissing as e:
        print(f"apprentice grader: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    ensure_topics(common.kafka_bootstrap, common.topics, security=common)
    errors: list[str] = []
    producer = durable_producer({**librdkafka_config(common), "bootstrap.servers": common.kafka_bootstrap})
    topic, value, key = common.topics.grader_rules, rec.model_dump_json().encode(), rec.key.encode()
    headers: KafkaHeaders = [*signer.headers(contract_name(topic) or topic, key, value)] if signer is not None else []
    producer.produce(topic, value, key, headers=headers,
                     on_delivery=lambda err, _m: errors.append(str(err)) if err else None)
    if producer.flush(30) or errors:
        print(f"apprentice grader: the rule was not written: {errors[0] if errors else 'timed out'}", file=sys.stderr)
        return 1
    what = "deleted" if rec.deleted else "set"
    print(f"grading rule {what} for tenant {rec.tenant}, task {rec.task} (revision {rec.revision}"
          f"{', signed as ' + OPERATOR if signer else ', unsigned'}); the grader applies it within a few seconds")
    return 0


def read_rules(common: Any, timeout_s: float = 15.0) -> dict[str, tuple[dict[str, Any] | None, str]]:
    """key -> (the latest record's JSON, "" or why it does not read as a rule record) on the rules topic
    (read to its end: shared/kafka/reader.py; `ReadTimeout` when it cannot be in `timeout_s`)."""
    out: dict[str, tuple[dict[str, Any] | None, str]] = {}
    try:
        records = list(read_topic_to_end(common.kafka_bootstrap, common.topics.grader_rules,
                                         purpose="apprentice-cli-rules", security=common, timeout_s=timeout_s))
    except TopicMissing:
        return out
    for m in records:
        key = (m.key() or b"").decode(errors="replace")
        try:
            out[key] = (json.loads(m.value() or b"null"), "")
            RuleRecord.model_validate(out[key][0])
        except ValueError as e:
            out[key] = (None, str(e).splitlines()[0])
    return out


def _list(common: Any, *, as_json: bool) -> int:
    if not broker_answers(common.kafka_bootstrap, security=common):
        print(f"apprentice grader: {unreachable(KAFKA, common.kafka_bootstrap)}", file=sys.stderr)
        return EXIT_UNREACHABLE
    try:
        read = read_rules(common)
    except ReadTimeout as e:     # a partial list would look complete
        print(f"apprentice grader: {e}", file=sys.stderr)
        return 1
    rules = {k: v for k, v in read.items() if v[0] is None or not v[0].get("deleted")}
    if as_json:
        print(json.dumps([{"key": k, "record": r, "error": err} for k, (r, err) in sorted(rules.items())], indent=1))
        return 0
    if not rules:
        print("no grading rules set at run time (the grader's config file applies)")
        return 0
    for key, (r, err) in sorted(rules.items()):
        if r is None:
            print(f"{key}: not a rule record ({err})")
            continue
        doc = r.get("rules") or {}
        graders = ", ".join(f"{g.get('type')} {g.get('kpi') or g.get('kind') or g.get('name')}"
                            for g in doc.get("graders", []))
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.get("set_at") or 0))
        print(f"{rule_key(r['tenant'], r['task'])}: window {doc.get('feedback_window_s', 300):g} s, {graders} "
              f"(revision {r['revision']}, by {r['operator']} at {when})")
    return 0
