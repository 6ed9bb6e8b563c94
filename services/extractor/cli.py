"""`apprentice knowledge ...`: read and curate the experiential knowledge bases.

    apprentice knowledge [list] [--tenant T]         the bases and their latest versions
    apprentice knowledge show [KEY] [--tenant T] [--version N] [--training-view]
    apprentice knowledge approve|reject|pin KEY ITEM_ID [--operator NAME] [--override-screen]
    apprentice knowledge edit KEY ITEM_ID TEXT [--operator NAME]
    apprentice knowledge retire|restore KEY ITEM_ID [--operator NAME] [--override-screen]
    apprentice knowledge split KEY ITEM_ID --text TEXT [--operator NAME]

`show` prints each item's state (pending, serving in context, consolidated in a version, retired with the
reason and the item that superseded it, rejected), the questions it answers and the terms a correct answer
holds, its provenance (who sent it, from which interactions, every merge with the merged text, every review)
and its injection-screen flags; approving, pinning, retiring or restoring a flagged item needs
`--override-screen`. `restore` undoes a supersession (or a retirement): the item serves again. `split` undoes a
merge: TEXT, a merged text `show` prints under the item, becomes a pending item of its own. Reads name
the tenant (the KEY's, or `--tenant`); without keys or as a service, listing every tenant shows nothing.

Talks to a running extractor over gRPC (`--endpoint`, default APPRENTICE_EXTRACTOR_ENDPOINT, else the running
stack's as `apprentice up` recorded it, else 127.0.0.1:50053; `--target` and APPRENTICE_EXTRACTOR_TARGET
are the deprecated names). `list` and `show` fall back to reading the compacted knowledge topic when no extractor
answers (or with `--from-topic`); changes always go through the extractor, the single writer.
"""

from __future__ import annotations

import argparse
import getpass
import sys
import textwrap
from datetime import UTC, datetime

import grpc

from shared.kafka.admin import broker_answers
from shared.proto.apprentice.v1 import events_pb2, knowledge_pb2, knowledge_pb2_grpc
from shared.rpc.grpc_util import LIST_SCOPE_METADATA
from shared.security.channels import open_channel
from shared.settings import CommonSettings, renamed_env
from shared.unreachable import (
    EXIT_UNREACHABLE,
    KAFKA,
    grpc_unreachable_reason,
    kafka_unreachable,
    unreachable,
)

S = events_pb2.ItemStatus
STATE = {S.ITEM_STATUS_PROPOSED: "pending", S.ITEM_STATUS_APPROVED: "serving in context",
         S.ITEM_STATUS_PINNED: "serving in context", S.ITEM_STATUS_CONSOLIDATED: "consolidated",
         S.ITEM_STATUS_RETIRED: "retired", S.ITEM_STATUS_REJECTED: "rejected", S.ITEM_STATUS_UNSPECIFIED: "?"}
"""Status --> the state an operator reads (as the dashboard shows it): approved and pinned items are put into
relevant requests' prompts; a consolidated one is answered by a promoted version's weights instead."""
STATES = ("pending", "serving in context", "consolidated", "retired", "rejected", "?")
STATE_WIDTH = max(len(s) for s in STATES)
NOTHING_VISIBLE = ("no knowledge bases visible without a tenant: this caller is not an operator (a service "
                   "key, or a server without keys), so it names one: --tenant T, or show TENANT/DOMAIN")
"""An empty list for a caller that may not list every tenant: not "there are none" (and not an error either;
a refused read is PERMISSION_DENIED, printed as such)."""
NO_BASES_YET = ("no knowledge bases yet: the extractor creates one per TENANT/DOMAIN from graded "
                "interactions (corrections and feedback on served answers)")
"""An empty list for a caller that sees everything it asked for: nothing has been learnt yet."""
ORDER = {S.ITEM_STATUS_PINNED: 0, S.ITEM_STATUS_APPROVED: 1, S.ITEM_STATUS_PROPOSED: 2, S.ITEM_STATUS_CONSOLIDATED: 3,
         S.ITEM_STATUS_RETIRED: 4, S.ITEM_STATUS_REJECTED: 5}
DONE = {"approve": "approved", "reject": "rejected", "pin": "pinned", "retire": "retired", "restore": "restored"}


def _when(ts: object) -> str:
    secs = getattr(ts, "seconds", 0)
    if not secs:
        return "-"
    return datetime.fromtimestamp(secs, UTC).strftime("%Y-%m-%d %H:%M")


def _state(it: events_pb2.KnowledgeItem) -> str:
    return STATE.get(it.status, "?")


def format_snapshot(snap: events_pb2.KnowledgeSnapshot, *, width: int = 100) -> str:
    """One base as text a person can scan: header with the count per state, then items grouped by state
    (serving first, pinned ones before the others), each with what its state means for it."""
    counts: dict[str, int] = {}
    for it in snap.items:
        counts[_state(it)] = counts.get(_state(it), 0) + 1
    parts = ", ".join(f"{counts[k]} {k}" for k in STATES if k in counts) or "empty"
    by_id = {it.item_id: it for it in snap.items}
    lines = [f"{snap.key}  version {snap.version}  ({len(snap.items)} items: {parts})",
             f"  approval: {'required (new items wait as PROPOSED)' if snap.require_approval else 'automatic'}"
             f"   last change: {snap.change or '-'}   at {_when(snap.envelope.occurred_at)}"]
    if snap.extractor_model:
        lines.append(f"  extractor: {snap.extractor_model} @ {snap.extractor_policy_version or '?'}")
    for it in sorted(snap.items, key=lambda i: (ORDER.get(i.status, 9), -i.created_at.seconds)):
        head = f"  [{_state(it):<{STATE_WIDTH}}] {it.item_id}  "
        body = textwrap.wrap(it.text, width=max(40, width - len(head))) or [""]
        lines.append(head + body[0])
        lines.extend(" " * len(head) + b for b in body[1:])
        pad, wrap = " " * len(head), max(40, width - len(head))
        src = list(it.source_interaction_ids)
        shown = ", ".join(s[:8] for s in src[:3]) + (f", +{len(src) - 3} more" if len(src) > 3 else "")
        meta = (f"helpful {it.helpful} / harmful {it.harmful} · {it.token_count} tokens · from {len(src)} "
                f"interaction{'s' if len(src) != 1 else ''} ({shown}) · by {it.created_by or '?'} · {_when(it.created_at)}")
        if it.edited_by:
            meta += f" · last changed by {it.edited_by}"
        if it.revision > 1:
            meta += f" · revision {it.revision}"
        lines.append(pad + meta)
        notes = _state_lines(snap.key, it, by_id)
        if it.questions:
            notes.append("questions: " + " | ".join(it.questions))
        if it.answer_terms:
            notes.append("answer terms: " + ", ".join(it.answer_terms))
        lines.extend(pad + line for note in notes
                     for line in textwrap.wrap(note, width=wrap, subsequent_indent="  ", break_on_hyphens=False))
        if it.screen_flags:
            lines.append(" " * len(head) + "SCREEN FLAGS: " + ", ".join(it.screen_flags)
                         + " (never auto-approved; approve only with --override-screen)")
        lines.extend(pad + format_provenance(p) for p in it.provenance)
    return "\n".join(lines)


def _state_lines(key: str, it: events_pb2.KnowledgeItem,
                 by_id: dict[str, events_pb2.KnowledgeItem]) -> list[str]:
    """What the item's state means: pinned, consolidated in which version, back from consolidation, retired
    why and superseded by which item (with that item's text)."""
    if it.status == S.ITEM_STATUS_PINNED:
        return ["pinned: always kept (exempt from the token cap)"]
    if it.status == S.ITEM_STATUS_CONSOLIDATED:
        return [f"consolidated in {it.consolidated_in or '?'}: that version answers its questions without it "
                "(out of the serving context, still taught)"]
    if it.status == S.ITEM_STATUS_APPROVED and it.lost_in:
        return [f"back in context: {it.lost_in} does not answer its questions"]
    if it.status != S.ITEM_STATUS_RETIRED:
        return []
    why = it.retired_reason or "-"
    if it.superseded_by:
        newer = by_id.get(it.superseded_by)
        why = f"superseded by {it.superseded_by} " + (f"({_state(newer)}): {newer.text}" if newer is not None
                                                      else "(no longer in this base)")
    return [f"retired: {why}", f"undo: apprentice knowledge restore {key} {it.item_id}"]


def format_provenance(p: events_pb2.Provenance) -> str:
    """One provenance entry: when, what, by whom (role:key id), from which interactions."""
    who = f"{p.principal.role or 'unknown'}:{p.principal.key_id or '?'}"
    if p.principal.tenant:
        who += f"@{p.principal.tenant}"
    ids = list(p.interaction_ids)
    src = f" from {', '.join(i[:8] for i in ids[:3])}{f' +{len(ids) - 3}' if len(ids) > 3 else ''}" if ids else ""
    extra = "".join(f" · {x}" for x in (p.source, p.detail) if x)
    if p.other_item_id:
        extra += f" · item {p.other_item_id}"
    if p.text:
        extra += f" · text: {p.text!r}"
    return f"- {_when(p.at)} {p.action} by {who}{src}{extra}"


def format_list(snaps: list[events_pb2.KnowledgeSnapshot]) -> str:
    if not snaps:
        return "no knowledge bases yet"
    rows = [("KEY", "VERSION", "ITEMS", "PENDING", "SERVING", "CONSOLIDATED", "RETIRED", "REJECTED", "APPROVAL")]
    for s in snaps:
        n = {state: sum(1 for i in s.items if _state(i) == state) for state in STATES}
        rows.append((s.key, str(s.version), str(len(s.items)), str(n["pending"]), str(n["serving in context"]),
                     str(n["consolidated"]), str(n["retired"]), str(n["rejected"]),
                     "required" if s.require_approval else "auto"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="apprentice knowledge", description="Show and curate the knowledge bases.")

    p.add_argument("--endpoint", "--target", dest="endpoint",
                   default=renamed_env("APPRENTICE_EXTRACTOR_ENDPOINT", "APPRENTICE_EXTRACTOR_TARGET", "127.0.0.1:50053"),
                   help="host:port of the extractor's Knowledge service (--target: the deprecated name)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per call")
    sub = p.add_subparsers(dest="cmd")
    ls = sub.add_parser("list", help="the bases and their latest versions")
    ls.add_argument("--tenant", default="")
    ls.add_argument("--from-topic", action="store_true", help="read the knowledge topic instead of the service")
    sh = sub.add_parser("show", help="print a base (all bases without KEY)")
    sh.add_argument("key", nargs="?", default="")
    sh.add_argument("--tenant", default="", help="the tenant to read (default: the KEY's)")
    sh.add_argument("--version", type=int, default=0, help="0 = latest")
    sh.add_argument("--training-view", action="store_true", help="only items that may reach the trainer")
    sh.add_argument("--from-topic", action="store_true", help="read the knowledge topic instead of the service")
    helps = {"retire": "retire one item (never served or trained on; restore undoes it)",
             "restore": "serve a retired item again (undo a supersession or a retirement)"}
    for name in ("approve", "reject", "pin", "retire", "restore"):
        a = sub.add_parser(name, help=helps.get(name, f"{name} one item"))
        a.add_argument("key")
        a.add_argument("item_id")
        a.add_argument("--operator", default="")
        if name != "reject":
            a.add_argument("--override-screen", action="store_true",
                           help="the item is flagged by the injection screen and you have read it")
    e = sub.add_parser("edit", help="replace an item's text (its id stays)")
    e.add_argument("key")
    e.add_argument("item_id")
    e.add_argument("text")
    e.add_argument("--operator", default="")
    sp = sub.add_parser("split", help="undo a merge: a merged text becomes a pending item of its own")
    sp.add_argument("key")
    sp.add_argument("item_id")
    sp.add_argument("--text", required=True, help="the merged text, as `show` prints it under the item")
    sp.add_argument("--operator", default="")
    return p


def _operator(given: str) -> str:
    if given:
        return given
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001
        return "operator"


def _from_topic(keys: list[str] | None) -> list[events_pb2.KnowledgeSnapshot]:
    # deferred: the snapshot reader loads numpy (shared.contracts.validation); `apprentice` imports this module
    from services.extractor.snapshots import read_snapshots

    common = CommonSettings()
    latest: dict[str, events_pb2.KnowledgeSnapshot] = {}
    for s in read_snapshots(common.kafka_bootstrap, common.topics.knowledge):
        if s.key not in latest or s.version > latest[s.key].version:
            latest[s.key] = s
    return [latest[k] for k in sorted(latest) if not keys or k in keys]


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    cmd = args.cmd or "list"

    if cmd in ("list", "show") and getattr(args, "from_topic", False):
        return _print_offline(cmd, args)
    channel = open_channel(args.endpoint)
    stub = knowledge_pb2_grpc.KnowledgeStub(channel)
    try:
        def named(key: str) -> tuple[tuple[str, str], ...]:
            """Reads name their tenant (servers refuse unnamed reads from callers without a tenant)."""
            tenant = getattr(args, "tenant", "") or key.partition("/")[0]
            return (("x-apprentice-tenant", tenant),) if tenant else ()

        def listed() -> tuple[list[str], str]:
            """The keys the caller may list, and what an empty list means (`nothing_listed`)."""
            resp, call = stub.List.with_call(knowledge_pb2.ListKnowledgeRequest(tenant=args.tenant),
                                             timeout=args.timeout)
            scope = dict(call.trailing_metadata() or ()).get(LIST_SCOPE_METADATA, "")
            return [b.key for b in resp.bases], nothing_listed(args.tenant, str(scope))

        if cmd == "list":
            keys, empty = listed()
            snaps = [stub.Get(knowledge_pb2.GetKnowledgeRequest(key=k), timeout=args.timeout, metadata=named(k))
                     for k in keys]
            print(format_list(snaps) if snaps else empty)
        elif cmd == "show":
            keys, empty = ([args.key], "") if args.key else listed()
            if not keys:
                print(empty)
            for i, key in enumerate(keys):
                snap = stub.Get(knowledge_pb2.GetKnowledgeRequest(key=key, version=args.version,
                                                                  training_view=args.training_view),
                                timeout=args.timeout, metadata=named(key))
                print(("\n" if i else "") + format_snapshot(snap))
        elif cmd == "edit":
            snap = stub.Edit(knowledge_pb2.EditItemRequest(key=args.key, item_id=args.item_id, text=args.text,
                                                           operator=_operator(args.operator)), timeout=args.timeout)
            print(f"edited {args.item_id}: {args.key} is now version {snap.version}")
        elif cmd == "split":
            snap = stub.Split(knowledge_pb2.EditItemRequest(key=args.key, item_id=args.item_id, text=args.text,
                                                            operator=_operator(args.operator)), timeout=args.timeout)
            new = next((it.item_id for it in snap.items if it.item_id != args.item_id
                        and it.text.strip() == args.text.strip()), "?")
            print(f"split {new} off {args.item_id} (pending): {args.key} is now version {snap.version}")
        else:
            call = {"approve": stub.Approve, "reject": stub.Reject, "pin": stub.Pin, "retire": stub.Retire,
                    "restore": stub.Restore}[cmd]
            snap = call(knowledge_pb2.ItemActionRequest(key=args.key, item_id=args.item_id,
                                                        operator=_operator(args.operator),
                                                        override_screen=getattr(args, "override_screen", False)),
                        timeout=args.timeout)
            print(f"{DONE[cmd]} {args.item_id}: {args.key} is now version {snap.version}")
        return 0
    except grpc.RpcError as e:
        code = e.code()
        reason = grpc_unreachable_reason(e)
        if (reason is not None or code == grpc.StatusCode.UNAVAILABLE) and cmd in ("list", "show"):
            return _print_offline(cmd, args, extractor_down=True)
        if reason is not None:  # the stack is down (or elsewhere): which service, where, what to do
            print(f"apprentice knowledge {cmd}: {unreachable('extractor', args.endpoint, reason)}", file=sys.stderr)
            return EXIT_UNREACHABLE
        print(f"apprentice knowledge {cmd}: {code.name}: {e.details()}", file=sys.stderr)
        return 1
    finally:
        channel.close()


def nothing_listed(tenant: str, scope: str) -> str:
    """What an empty `list` means, by the scope the server says it listed (LIST_SCOPE_METADATA): nothing
    learnt yet (every tenant, or the caller's or the named one) or nothing visible to this caller; a server
    that does not say is read the cautious way."""
    if tenant:
        return f"no knowledge bases yet for tenant {tenant!r}" + NO_BASES_YET.removeprefix("no knowledge bases yet")
    return NO_BASES_YET if scope in ("all", "tenant") else NOTHING_VISIBLE


def _print_offline(cmd: str, args: argparse.Namespace, *, extractor_down: bool = False) -> int:
    """`list` / `show` from the compacted knowledge topic (`--from-topic`, or no extractor answers). With
    the broker down as well, one line says that both are down and how to start them."""

    common = CommonSettings()
    if not broker_answers(common.kafka_bootstrap, security=common):
        line = unreachable(KAFKA, common.kafka_bootstrap)
        if extractor_down:
            line = (f"neither the extractor service at {args.endpoint} nor the Kafka broker at "
                    f"{common.kafka_bootstrap} (its knowledge topic) is answering; start the local stack with "
                    "`apprentice up` (or set APPRENTICE_EXTRACTOR_ENDPOINT / APPRENTICE_KAFKA_BOOTSTRAP)")
        print(f"apprentice knowledge {cmd}: {line}", file=sys.stderr)
        return EXIT_UNREACHABLE
    if extractor_down:
        print(f"(no extractor at {args.endpoint}; reading the knowledge topic)", file=sys.stderr)
    try:
        snaps = _from_topic([args.key] if cmd == "show" and args.key else None)
    except Exception as e:  # noqa: BLE001 - tell the person what failed
        if kafka_unreachable(e):
            print(f"apprentice knowledge {cmd}: {unreachable(KAFKA, common.kafka_bootstrap)}", file=sys.stderr)
            return EXIT_UNREACHABLE
        print(f"apprentice knowledge {cmd}: cannot read the knowledge topic: {e}", file=sys.stderr)
        return 1
    if cmd == "list":
        listed = [s for s in snaps if not args.tenant or s.key.startswith(args.tenant + "/")]
        print(format_list(listed) if listed else nothing_listed(args.tenant, "all"))
        return 0
    if not snaps:
        print(f"no knowledge base {args.key!r}" if args.key else NO_BASES_YET)
        return 1 if args.key else 0
    # heavy: presidio/spaCy (the PII screen); `apprentice` imports this module
    from services.extractor.knowledge import training_view

    for i, snap in enumerate(snaps):
        if args.version and snap.version != args.version:
            print(f"{snap.key}: only the latest version ({snap.version}) is on the compacted topic", file=sys.stderr)
            return 1
        print(("\n" if i else "") + format_snapshot(training_view(snap) if args.training_view else snap))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
