"""`apprentice knowledge` output is readable, and the top-level dispatcher reaches it."""

from __future__ import annotations

import pytest

from services.extractor.cli import format_list, format_snapshot, main
from shared.cli.main import main as apprentice
from shared.proto.apprentice.v1 import events_pb2

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
    assert lines[0] == "acme/support  version 7  (2 items: 1 pinned, 1 proposed)"
    assert "approval: required" in lines[1] and "approve item b by olga" in lines[1]
    assert lines[2] == "  extractor: smollm2 @ v3"
    assert lines[3].startswith("  [PINNED  ] bbbbbbbbbbbb  Pinned rule")          # pinned first
    assert all(len(line) <= 80 for line in lines[3:] if "helpful" not in line)      # item text wrapped
    assert "helpful 0 / harmful 2" in out and "from 4 interactions (i1, i2, i3, +1 more)" in out
    assert "last changed by olga" in out


def test_list_table() -> None:
    out = format_list([snapshot()])
    assert out.splitlines()[0].split() == ["KEY", "VERSION", "ITEMS", "TRAINING", "PROPOSED", "APPROVAL"]
    assert out.splitlines()[1].split() == ["acme/support", "7", "2", "1", "1", "required"]
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
