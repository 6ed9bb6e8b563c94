"""Contracts: every event round-trips, committed stubs are current, released fields never change."""

from __future__ import annotations

import filecmp
import importlib.util
import json
from pathlib import Path

import pytest

from shared.contracts import events, topics
from shared.proto.apprentice.v1 import common_pb2, events_pb2, inference_pb2, knowledge_pb2, weights_pb2

REPO = Path(__file__).resolve().parents[3]


def _generate_module():
    spec = importlib.util.spec_from_file_location("proto_generate", REPO / "protos" / "generate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _sample(msg_type):
    """A message with every scalar/repeated field set, so a round trip exercises each one."""
    msg = msg_type()
    for f in msg_type.DESCRIPTOR.fields:
        if f.message_type is not None and not f.message_type.GetOptions().map_entry:
            if f.is_repeated:
                getattr(msg, f.name).add()
            else:
                getattr(msg, f.name).SetInParent()
        elif f.message_type is not None:  # map
            getattr(msg, f.name)["k"] = _scalar(f.message_type.fields_by_name["value"])
        elif f.is_repeated:
            getattr(msg, f.name).append(_scalar(f))
        else:
            setattr(msg, f.name, _scalar(f))
    return msg


def _scalar(f):
    t = f.type
    if t == f.TYPE_STRING:
        return "x"
    if t == f.TYPE_BYTES:
        return b"\x00\xff"
    if t == f.TYPE_BOOL:
        return True
    if t in (f.TYPE_FLOAT, f.TYPE_DOUBLE):
        return 0.5
    if t == f.TYPE_ENUM:
        return 1
    return 7


@pytest.mark.parametrize("base_topic", topics.EVENT_TOPICS)
def test_every_event_round_trips(base_topic: str) -> None:
    msg_type = events.message_type(base_topic)
    msg = _sample(msg_type)
    msg.envelope.CopyFrom(events.make_envelope("acme", source="test"))
    data = msg.SerializeToString()
    back = events.decode(msg_type, data)
    assert back == msg
    assert json.loads(events.to_json(back))["envelope"]["tenant"] == "acme"


def test_decode_rejects_garbage_and_missing_envelope() -> None:
    with pytest.raises(events.UndecodableEvent, match="not a apprentice.v1.Interaction"):
        events.decode(events_pb2.Interaction, b"\xff\xff\xff\xff")
    with pytest.raises(events.UndecodableEvent, match="envelope"):
        events.decode(events_pb2.Interaction, events_pb2.Interaction(interaction_id="i").SerializeToString())
    with pytest.raises(events.UndecodableEvent, match="tombstone"):
        events.decode(events_pb2.Interaction, None)


def test_envelope_requires_tenant_and_deterministic_ids_are_stable() -> None:
    with pytest.raises(ValueError, match="tenant"):
        events.make_envelope("", source="t")
    env = events.make_envelope("t1", source="s", event_id=events.deterministic_id("i1", "2"))
    assert env.event_id == events.deterministic_id("i1", "2") != events.deterministic_id("i1", "3")
    assert env.occurred_at.seconds > 0 and env.trace_id


def test_committed_stubs_are_current(tmp_path: Path) -> None:
    gen = _generate_module()
    gen.generate(tmp_path, update_lock=False)
    committed = REPO / "shared" / "proto"
    for path in tmp_path.rglob("*.py*"):
        rel = path.relative_to(tmp_path)
        assert filecmp.cmp(path, committed / rel, shallow=False), f"{rel} is stale: run `make protos`"


def test_wire_lock_covers_current_protos_and_nothing_changed(tmp_path: Path) -> None:
    gen = _generate_module()
    locked = json.loads(gen.LOCK.read_text())
    # The real descriptors of the generated modules, in the same shape as the lock.
    from google.protobuf import descriptor_pb2

    fds = descriptor_pb2.FileDescriptorSet()
    for mod in (common_pb2, events_pb2, inference_pb2, knowledge_pb2, weights_pb2):
        fd = descriptor_pb2.FileDescriptorProto()
        mod.DESCRIPTOR.CopyToProto(fd)
        fds.file.append(fd)
    current = gen.describe(fds.SerializeToString())
    assert gen.check_compatible(locked, current) == []
    for msg, fields in current.items():
        assert msg in locked, f"{msg} is not in protos/wire_lock.json: run `make protos`"
        assert set(fields) <= set(locked[msg]), f"new fields of {msg} are not locked: run `make protos`"


def test_wire_guard_detects_renumber_retype_and_removal() -> None:
    gen = _generate_module()
    locked = {"apprentice.v1.X": {"a": [1, "TYPE_STRING", "LABEL_OPTIONAL"], "b": [2, "TYPE_INT32", "LABEL_OPTIONAL"]}}
    assert gen.check_compatible(locked, {"apprentice.v1.X": {"a": [3, "TYPE_STRING", "LABEL_OPTIONAL"],
                                                             "b": [2, "TYPE_INT32", "LABEL_OPTIONAL"]}})
    assert gen.check_compatible(locked, {"apprentice.v1.X": {"a": [1, "TYPE_BYTES", "LABEL_OPTIONAL"],
                                                             "b": [2, "TYPE_INT32", "LABEL_OPTIONAL"]}})
    assert gen.check_compatible(locked, {"apprentice.v1.X": {"a": [1, "TYPE_STRING", "LABEL_OPTIONAL"]}})
    assert gen.check_compatible(locked, {"apprentice.v1.X": {**locked["apprentice.v1.X"],
                                                             "c": [2, "TYPE_STRING", "LABEL_OPTIONAL"]}})
    assert gen.check_compatible(locked, {"apprentice.v1.X": {**locked["apprentice.v1.X"],
                                                             "c": [3, "TYPE_STRING", "LABEL_OPTIONAL"]}}) == []
