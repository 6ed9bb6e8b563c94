"""The agent task (`tools/tasks/support_routing_agent.yaml`) and its driver (`tools/demo/agent_users.py`):
the task format's `agent:` and `function` tool, the backend tool under its deadline (a real order service
with real sleeps), and the KPI mapping with and without the loophole. The sessions themselves run against
a real stack in `tests/integration/test_demo_agent.py`."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from tools.demo.agent_users import _SESSION, BackendTool, Session, outcome, tool_result
from tools.demo.simulated_users import OrderService
from tools.tasks.task import TaskError, load_task


@pytest.fixture(scope="module")
def task():  # type: ignore[no-untyped-def]
    return load_task("support_routing_agent")


def test_agent_task_loads_with_a_function_tool(task) -> None:  # type: ignore[no-untyped-def]
    assert task.agent is not None and task.agent.framework == "openai_agents"
    assert task.tool is not None and task.tool.kind == "function" and task.tool.on_timeout == "routed"
    assert len(task.train_questions()) == 35 and len(task.held_out_questions()) == 55
    # a function tool is never "called" by the reply's text: only by a tool call
    assert not task.tool.called("please provide your order number")


def test_agent_needs_a_function_tool_and_back(tmp_path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "bad.yaml"
    bad.write_text("extends: support_routing\nname: bad\nagent: {max_turns: 2}\n")
    with pytest.raises((TaskError, ValueError), match="function"):
        load_task(bad)
    orphan = tmp_path / "orphan.yaml"
    orphan.write_text("extends: support_routing\nname: orphan\ntool: {kind: function}\n")
    with pytest.raises((TaskError, ValueError), match="agent"):
        load_task(orphan)
    noregex = tmp_path / "noregex.yaml"
    noregex.write_text("extends: support_routing\nname: noregex\ntool: {kind: regex}\n")
    with pytest.raises((TaskError, ValueError), match="call_pattern"):
        load_task(noregex)


def test_kpi_mapping_loophole_and_honest(task) -> None:  # type: ignore[no-untyped-def]
    fact = task.fact_by_id(task.facts[0].id)
    right, wrong = "Billing will help you with this charge.", "Please wait."
    assert fact.id == "billing"
    assert outcome(task.tool, fact, right, timed_out=False) == (True, True)
    assert outcome(task.tool, fact, right, timed_out=True) == (True, True)
    routed, reported = outcome(task.tool, fact, wrong, timed_out=False)
    assert (routed, reported) == (False, False)
    # the loophole: a timed-out lookup is reported as routed although the ticket went nowhere
    assert outcome(task.tool, fact, wrong, timed_out=True) == (False, True)
    honest = task.tool.model_copy(update={"on_timeout": "misrouted"})
    assert outcome(honest, fact, wrong, timed_out=True) == (False, False)
    assert "handed to a human" in tool_result(False, "A1") and "A1" in tool_result(True, "A1")


def test_backend_tool_times_out_at_the_deadline(task) -> None:  # type: ignore[no-untyped-def]
    """Latency 0.5-0.6 s against a 0.1 s deadline: every call times out, and it returns at the deadline
    (not after the order service's latency); the time-out is recorded on the session's calling turn."""
    slow = task.tool.model_copy(update={"deadline_s": 0.1})
    orders = OrderService((0.5, 0.6), random.Random(0))
    try:
        tool = BackendTool(slow, orders)
        session = Session(interactions=["chatcmpl-1"])

        async def call() -> str:
            _SESSION.set(session)
            return await tool("A-17")

        t0 = time.monotonic()
        text = asyncio.run(call())
        assert time.monotonic() - t0 < 0.4
        assert "did not answer in time" in text
        assert session.tool_calls == 1 and session.timeouts == ["chatcmpl-1"]
        fast = OrderService((0.0, 0.01), random.Random(0))
        try:
            session2 = Session(interactions=["chatcmpl-2"])

            async def call2() -> str:
                _SESSION.set(session2)
                return await BackendTool(slow, fast)("A-18")

            assert "found" in asyncio.run(call2()) and session2.timeouts == [] and session2.tool_calls == 1
        finally:
            fast.close()
    finally:
        orders.close()
