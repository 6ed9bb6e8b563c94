"""The extractor reads an agent's session with its tool calls and tool results (services/extractor/
trajectories.py): a round's output names the calls it made, the next round's input names the function each
result came from, and the extraction prompt holds both (services/extractor/prompt.py)."""

from __future__ import annotations

from services.extractor.prompt import render_history
from services.extractor.trajectories import Trajectory, turn_from_graded
from shared.proto.apprentice.v1 import common_pb2, events_pb2


def _graded(iid: str, messages: list[common_pb2.ChatMessage], text: str,
            calls: list[common_pb2.ToolCall] | None = None) -> events_pb2.GradedInteraction:
    it = events_pb2.Interaction(interaction_id=iid, session_id="s", messages=messages, response_text=text,
                                response_tool_calls=calls or [])
    return events_pb2.GradedInteraction(interaction=it, reward=1.0, has_signal=True, success=True, revision=1)


def test_rounds_render_tool_calls_and_results() -> None:
    user = common_pb2.ChatMessage(role="user", content="Where is order 42?")
    call = common_pb2.ToolCall(id="c1", name="lookup_order", arguments='{"order_id": 42}')
    first = _graded("a", [user], '<tool_call>{"name": "lookup_order"}</tool_call>', [call])
    history = [user, common_pb2.ChatMessage(role="assistant", tool_calls=[call]),
               common_pb2.ChatMessage(role="tool", tool_call_id="c1", content='{"carrier": "DHL", "eta": "Mon"}')]
    second = _graded("b", history, "It ships with DHL and arrives Monday.")
    traj = Trajectory("t", "general", "s", [turn_from_graded(first), turn_from_graded(second)])
    rounds = render_history(traj, 1500)
    assert '[tool call] lookup_order({"order_id": 42})' in rounds[0]
    assert '[tool result of lookup_order (call c1)] {"carrier": "DHL", "eta": "Mon"}' in rounds[1]
    assert "arrives Monday" in rounds[1]
