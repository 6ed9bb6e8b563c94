"""`apprentice knowledge` output is readable (every state, what it means for the item, questions, answer
terms, merges and supersession), the undo commands reach the real Knowledge service, and the top-level
dispatcher reaches it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from services.extractor.cli import format_list, format_snapshot, main
from services.extractor.servicer import create_knowledge_server
from shared.proto.apprentice.v1 import events_pb2
from shared.settings import CommonSettings
from tests.unit.dashboard.knowledge_states import (
    HOTLINE,
    KAYAKS,
    RETURNS,
    RETURNS_MERGED,
    SATURDAY,
    SHIPPING,
    TENT_18,
    TENT_24,
    Lifecycle,
    lifecycle,
)
from tools.cli.main import main as apprentice

S = events_pb2.ItemStatus


def snapshot() -> events_pb2.KnowledgeSnapshot:
    snap = events_pb2.KnowledgeSnapshot(key="acme/support", domain="support", version=7, require_approval=True,
                                        change="approve item b by olga", extractor_model="smollm2", extractor_policy_version="v3")
    snap.items.add(item_id="a" * 12, text="Proposed rule about shipping costs to islands.", status=S.ITEM_STATUS_PROPOSED,
                   source_interaction_ids=["i1", "i2", "i3", "i4"], created_by="llm:smollm2@v3", token_count=9, harmful=2)
    snap.items.add(item_id="b" * 12, text="Pinned rule " + "that is long " * 12, status=S.ITEM_STATUS_PINNED,
                   source_interaction_ids=["i9"], created_by="correction", edited_by="olga", helpful=4)
    return snap


def test_show_is_readable() -> None:
    out = format_snapshot(snapshot(), width=80)
    lines = out.splitlines()
    assert lines[0] == "acme/support  version 7  (2 items: 1 pending, 1 serving in context)"
    assert "approval: required" in lines[1] and "approve item b by olga" in lines[1]
    assert lines[2] == "  extractor: smollm2 @ v3"
    assert lines[3].startswith("  [serving in context] bbbbbbbbbbbb  Pinned rule")   # pinned first
    assert "pinned: always kept" in out and "  [pending           ] aaaaaaaaaaaa  Proposed rule" in out
    assert all(len(line) <= 80 for line in lines[3:] if "helpful" not in line)      # item text wrapped
    assert "helpful 0 / harmful 2" in out and "from 4 interactions (i1, i2, i3, +1 more)" in out
    assert "last changed by olga" in out


def test_list_table() -> None:
    out = format_list([snapshot()])
    assert out.splitlines()[0].split() == ["KEY", "VERSION", "ITEMS", "PENDING", "SERVING", "CONSOLIDATED", "RETIRED",
                                           "REJECTED", "APPROVAL"]
    assert out.splitlines()[1].split() == ["acme/support", "7", "2", "1", "1", "0", "0", "0", "required"]
    assert format_list([lifecycle().snapshot()]).splitlines()[1].split()[3:] == ["1", "2", "1", "2", "1", "required"]
    assert format_list([]) == "no knowledge bases yet"


def test_usage_errors_and_dispatch(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["approve", "only-key"])
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        apprentice(["knowledge", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "apprentice knowledge" in out and "approve" in out and "show" in out


def test_show_prints_provenance_and_screen_flags() -> None:
    snap = snapshot()
    it = snap.items[0]
    it.screen_flags.extend(["override_instructions", "special_token:<|im_start|>"])
    p = it.provenance.add(action="created", tenant="acme", source="correction", detail="feedback fb-1",
                          interaction_ids=["interaction-1"])
    p.principal.key_id, p.principal.role, p.principal.tenant = "acme-web", "backend", "acme"
    p.at.seconds = 1_767_225_600                                   # 2026-01-01 00:00 UTC
    r = it.provenance.add(action="rejected", source="operator", detail="operator olga")
    r.principal.key_id, r.principal.role = "olga-key", "operator"
    out = format_snapshot(snap)
    assert "SCREEN FLAGS: override_instructions, special_token:<|im_start|>" in out and "--override-screen" in out
    assert "- 2026-01-01 00:00 created by backend:acme-web@acme from interact · correction · feedback fb-1" in out
    assert "- - rejected by operator:olga-key · operator · operator olga" in out


def item_block(out: str, text: str) -> str:
    """The lines of the item whose text starts with `text`, up to the next item."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  [") and text[:30] in line)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("  [")), len(lines))
    return "\n".join(lines[start:end])


def test_show_prints_every_state_with_questions_terms_merges_and_supersession() -> None:
    lc = lifecycle()
    out = format_snapshot(lc.snapshot(), width=200)
    assert out.splitlines()[0].endswith("(7 items: 1 pending, 2 serving in context, 1 consolidated, 2 retired, "
                                        "1 rejected)")
    heads = [line.split("]")[0].strip(" [") for line in out.splitlines() if line.startswith("  [")]
    assert heads == ["serving in context", "serving in context", "pending", "consolidated", "retired", "retired",
                     "rejected"]
    returns = item_block(out, RETURNS)
    assert "questions: Which form do I need for a return? | What's the returns paperwork called?" in returns
    assert "answer terms: RF-7734" in returns and "from 2 interactions (i1, i2)" in returns
    assert "merged by unknown:? from i2 · correction" in returns and f"text: {RETURNS_MERGED!r}" in returns
    assert "consolidated in v7: that version answers its questions without it" in item_block(out, HOTLINE)
    old = item_block(out, TENT_18)
    assert f"retired: superseded by {lc.ids[TENT_24]} (serving in context): {TENT_24}" in old
    assert f"undo: apprentice knowledge restore acme/support {lc.ids[TENT_18]}" in old
    assert f"superseded by unknown:? · extractor · superseded by {lc.ids[TENT_24]}" in old
    assert "retired: retired by operator olga" in item_block(out, SHIPPING)
    assert "pinned: always kept" in item_block(out, KAYAKS)
    assert "retired" not in item_block(out, SATURDAY).split("\n")[1]
    # a later promoted version that does not answer it: serving again, and why
    lc.store.consolidate("acme", "v8", {})
    back = item_block(format_snapshot(lc.snapshot(), width=200), HOTLINE)
    assert back.startswith("  [serving in context]") and "back in context: v8 does not answer its questions" in back


@pytest.fixture
def knowledge_service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Lifecycle, str]]:
    """The real Knowledge gRPC service (no keys: the caller is anonymous) over a base in every state."""
    for var in ("APPRENTICE_AUTH_TOKEN", "APPRENTICE_AUTH_TOKEN_FILE", "APPRENTICE_TLS_CA"):
        monkeypatch.delenv(var, raising=False)
    lc = lifecycle()
    server, port, _ = create_knowledge_server(lc.store, 0, host="127.0.0.1",
                                              common=CommonSettings(auth_keys=SecretStr(""), home=tmp_path))
    server.start()
    yield lc, f"127.0.0.1:{port}"
    server.stop(0)


def test_restore_retire_and_split_commands(knowledge_service: tuple[Lifecycle, str],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    lc, endpoint = knowledge_service
    key = "acme/support"

    def run(*argv: str) -> tuple[int, str, str]:
        rc = main(["--endpoint", endpoint, *argv])
        out = capsys.readouterr()
        return rc, out.out, out.err

    def item(text: str) -> events_pb2.KnowledgeItem:
        return next(it for it in lc.snapshot().items if it.text == text)

    version = lc.snapshot().version
    assert run("restore", key, lc.ids[TENT_18], "--operator", "olga") == (
        0, f"restored {lc.ids[TENT_18]}: {key} is now version {version + 1}\n", "")
    assert item(TENT_18).status == events_pb2.ITEM_STATUS_APPROVED and item(TENT_18).superseded_by == ""
    assert run("retire", key, lc.ids[KAYAKS], "--operator", "olga")[:2] == (
        0, f"retired {lc.ids[KAYAKS]}: {key} is now version {version + 2}\n")
    assert item(KAYAKS).status == events_pb2.ITEM_STATUS_RETIRED and item(KAYAKS).retired_reason == "retired by operator olga"
    rc, out, _ = run("split", key, lc.ids[RETURNS], "--text", RETURNS_MERGED, "--operator", "olga")
    new = item(RETURNS_MERGED)
    assert (rc, out) == (0, f"split {new.item_id} off {lc.ids[RETURNS]} (pending): {key} is now version {version + 3}\n")
    assert new.status == events_pb2.ITEM_STATUS_PROPOSED and list(new.source_interaction_ids) == ["i2"]
    # refusals are the service's, with its reason
    rc, _, err = run("restore", key, lc.ids[TENT_24])
    assert rc == 1 and "FAILED_PRECONDITION" in err and "not retired" in err
    rc, _, err = run("split", key, lc.ids[TENT_24], "--text", "never merged")
    assert rc == 1 and "no merge of that text" in err
    with pytest.raises(SystemExit):
        main(["split", key, lc.ids[RETURNS]])                        # --text is required
    capsys.readouterr()
    # show reads it back through the service, in the state names
    rc, out, _ = run("show", key)
    assert rc == 0 and "2 pending" in out and f"[retired           ] {lc.ids[KAYAKS]}" in out
