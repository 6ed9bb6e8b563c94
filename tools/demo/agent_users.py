"""Task questions --> sessions with an AGENT (OpenAI Agents SDK) through the stack's OpenAI-compatible door.

The agent task's product backend (`tools/tasks/support_routing_agent.yaml`) is not a regex on the reply: each
simulated customer's message starts a session with an agent built with the OpenAI Agents SDK, pointed at
the stack's `/v1/chat/completions` (or `/v1/responses`) with the tenant's backend key. The agent's one tool
is a real function tool (`order_lookup(order_id)`), which the SDK sends as the request's `tools` and runs when
the model calls it; its body is the simulated backend's order service under the task's deadline
(`simulated_users.OrderService`). The business outcome, the ticket routed to the right team (the first team
the agent's final reply names), is sent as the KPI on the session's final interaction, which the stack
captures as the session's trajectory (docs/agents.md, "Agent trajectories"), so one reward covers every turn.

Why the OpenAI Agents SDK and not LangChain's `bind_tools` loop: it is the framework the issue names first,
it owns the whole tool loop (schema from the function's signature, tool messages, turn bound), and one
setting moves it from the chat-completions door to the Responses API (`agent.api`), so the same task drives
both doors. Its tracing is disabled (no network at run time).

The loophole is the regex variant's (`simulated_users.py`): a time-out is reported at once as the telemetry
KPI `timeout_kpi` = 1 on the turn that called the tool and on the final turn (the one the outcome rewards:
without it the detector would flag the calling turn and leave the trajectory that carries the reward clean),
and the outcome of a session with a timed-out lookup is `on_timeout` ("routed" is the loophole).
"""

from __future__ import annotations

import asyncio
import contextvars
import random
import ssl
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import httpx
from pydantic import Field

from shared.decoding.tool_calls import ToolSpec
from tools.demo.simulated_users import Exchange, OrderService, pick_questions
from tools.tasks.task import Fact, Task, Tool, check_answer


@dataclass
class Session:
    """One customer's conversation with the agent: the interaction ids the door returned, in order, and
    what the backend's tool did."""

    interactions: list[str] = field(default_factory=list)
    policy_version: str = ""       # the version that answered the last turn (`x-apprentice-policy-version`)
    completion_tokens: int = 0
    tool_calls: int = 0
    timeouts: list[str] = field(default_factory=list)    # the interaction that called each timed-out lookup


AGENT_MIN_NEW_TOKENS = 64
"""The new-token budget of an agent turn at least: room for one whole tool call."""

_SESSION: contextvars.ContextVar[Session | None] = contextvars.ContextVar("agent_session", default=None)


def outcome(tool: Tool, fact: Fact, final_text: str, timed_out: bool) -> tuple[bool, bool]:
    """(routed, reported): what really happened to the ticket (the task's answer check on the agent's final
    reply), and what the backend's KPI mapping reports. A session with a timed-out lookup is reported as
    `on_timeout` maps it; that mapping, not the agent, is where the loophole lives."""

    routed = check_answer(fact, final_text).value >= 1.0
    return routed, (tool.on_timeout == "routed") if timed_out else routed


def tool_result(found: bool, order_id: str) -> str:
    """What the agent reads back from the backend's lookup (a tool message): the order, or the time-out."""
    if found:
        return f"Order {order_id}: found, delivered, no open issue."
    return "The order service did not answer in time; the ticket was handed to a human agent."


class BackendTool:
    """The agent's function tool, run by the simulated backend: the order service under the deadline. A
    time-out is remembered on the current session (the interaction that called it) for the telemetry KPI."""

    def __init__(self, tool: Tool, orders: OrderService) -> None:
        self.tool, self.orders = tool, orders

    async def __call__(self, order_id: str) -> str:
        session = _SESSION.get()
        found = await asyncio.to_thread(self.orders.lookup, self.tool.deadline_s)
        if session is not None:
            session.tool_calls += 1
            if not found and session.interactions:
                session.timeouts.append(session.interactions[-1])
        return tool_result(found, order_id)


OrderId = Annotated[str, Field(max_length=12)]
"""The tool's one argument: a short id, so a call fits the turn's token budget (the quick demo's is 24 new
tokens; see AGENT_MIN_NEW_TOKENS)."""


def lookup_tool(task: Task, backend: Callable[[str], Awaitable[str]]) -> Any:
    """The task's `order_lookup` as an Agents SDK function tool that runs `backend` (the name, description
    and strict JSON schema the SDK sends come from here, for the agent and for `tool_spec` alike)."""
    from agents import function_tool

    assert task.tool is not None

    async def order_lookup(order_id: OrderId) -> str:
        """Look up the customer's order by its id."""
        return await backend(order_id)

    return function_tool(order_lookup, name_override=task.tool.name,
                         description_override=task.tool.description or None)


def tool_spec(task: Task) -> ToolSpec:
    """The function tool exactly as the Agents SDK offers it to the door, for what must render the agent's
    prompt without the SDK's request (the planted reward hack, tools/demo/reward_hack.py): the spec is
    only read, so its tool's backend is never called."""
    async def unread(order_id: str) -> str:
        raise RuntimeError("tool_spec's tool is read for its definition, never run")

    t = lookup_tool(task, unread)
    return ToolSpec(name=t.name, description=t.description, parameters=t.params_json_schema,
                    strict=t.strict_json_schema)


async def _capture_interaction(response: httpx.Response) -> None:
    """httpx response hook: the door's interaction id (the completion's / response's `id`) of every model
    call of the current session, in order. The SDK keeps no id for chat completions, so it is read here."""

    session = _SESSION.get()
    if session is None or response.request.method != "POST" or response.status_code != 200:
        return
    if not response.request.url.path.endswith(("/chat/completions", "/responses")):
        return
    session.policy_version = response.headers.get("x-apprentice-policy-version", session.policy_version)
    await response.aread()
    body = response.json()
    # the header names the interaction on both doors (a Responses API id is `resp_<interaction id>`)
    iid = response.headers.get("x-apprentice-interaction-ids", "").split(",")[0]
    if isinstance(body, dict) and (iid or body.get("id")):
        session.interactions.append(iid or str(body["id"]))
        usage = body.get("usage") or {}
        session.completion_tokens += int(usage.get("completion_tokens") or usage.get("output_tokens") or 0)


class AgentUsers:
    """The agent task's simulated users and product backend; `run` has `SimulatedUsers.run`'s contract (a
    list of `Exchange`, one per session, `interaction_id` = the session's final interaction)."""

    def __init__(self, task: Task, base_url: str, api_key: str, *, ca_file: Path | None = None,
                 concurrency: int = 4, seed: int = 0, timeout_s: float = 300.0, model: str | None = None) -> None:
        if task.agent is None or task.tool is None:
            raise ValueError(f"task {task.name!r} is no agent task (needs `agent:` and a function `tool`)")
        from agents import set_tracing_disabled

        set_tracing_disabled(True)
        self.task, self.base_url, self.api_key = task, base_url.rstrip("/"), api_key
        verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=str(ca_file)) if ca_file else True
        self._verify, self.timeout_s, self.concurrency = verify, timeout_s, concurrency
        self.rng = random.Random(seed)
        self.orders = OrderService(task.tool.latency_s, random.Random(seed + 1))
        self.backend_tool = BackendTool(task.tool, self.orders)
        self.model = model
        self.late_reported = 0       # the agent backend reports at once (the `SimulatedUsers` counter)
        self.abandoned = 0           # `SimulatedUsers`' counter: an agent session's failure propagates instead

    def pick(self, count: int, facts: set[str] | None = None) -> list[tuple[Fact, str]]:
        """As `SimulatedUsers.pick`."""
        return pick_questions(self.task, self.rng, count, facts)

    def _agent(self, client: Any, model: str, *, max_new_tokens: int, temperature: float, user: str) -> Any:
        from agents import (
            Agent,
            ModelSettings,
            OpenAIChatCompletionsModel,
            OpenAIResponsesModel,
        )

        assert self.task.tool is not None and self.task.agent is not None
        tool = lookup_tool(self.task, self.backend_tool)
        cls = OpenAIChatCompletionsModel if self.task.agent.api == "chat_completions" else OpenAIResponsesModel
        # a tool call in the family's format (e.g. Hermes' <tool_call>{"name": ..., "arguments": ...}</tool_call>)
        # takes ~30 tokens before its arguments: a turn gets at least AGENT_MIN_NEW_TOKENS, or every call is cut
        # one lookup a turn: with parallel calls allowed, a weak model follows its call with more until the
        # budget cuts one, which the Responses API reports as `incomplete` (and the Agents SDK raises)
        settings = ModelSettings(temperature=temperature, top_p=0.95 if temperature > 0 else None,
                                 max_tokens=max(max_new_tokens, AGENT_MIN_NEW_TOKENS), tool_choice=self.task.agent.tool_choice,
                                 parallel_tool_calls=False,
                                 extra_body={"task": self.task.task, "user": user, "tenant": self.task.tenant})
        return Agent(name=self.task.name, instructions=self.task.system_prompt, tools=[tool],
                     model=cls(model=model, openai_client=client), model_settings=settings)

    async def _session(self, client: Any, model: str, fact: Fact, question: str, *, max_new_tokens: int,
                       temperature: float) -> Exchange:
        from agents import Runner
        from agents.exceptions import MaxTurnsExceeded, ModelBehaviorError

        assert self.task.agent is not None and self.task.tool is not None
        session = Session()
        _SESSION.set(session)
        user = f"user-{uuid.uuid4().hex[:12]}"
        agent = self._agent(client, model, max_new_tokens=max_new_tokens, temperature=temperature, user=user)
        asked_at = time.monotonic()
        try:
            result = await Runner.run(agent, question, max_turns=self.task.agent.max_turns)
            final = str(result.final_output or "")
        except (MaxTurnsExceeded, ModelBehaviorError):
            # the agent never answered (out of turns; or, on the Responses API, a reply cut by its token
            # budget, which the SDK raises as `response.incomplete`): a misroute (unless the loophole)
            final = ""
        answered_at = time.monotonic()
        if not session.interactions:
            raise RuntimeError("the door returned no interaction id for the session")
        last = session.interactions[-1]
        timed_out = bool(session.timeouts)
        routed, reported = outcome(self.task.tool, fact, final, timed_out)
        async with self._http() as http:
            if timed_out:    # telemetry: on the calling turn(s) and on the turn the outcome rewards
                for iid in dict.fromkeys([*session.timeouts, last]):
                    await self._feedback(http, iid, self.task.tool.timeout_kpi, 1.0)
            await self._feedback(http, last, self.task.kpi.name, 1.0 if reported else 0.0)
        return Exchange(fact.id, question, last, final, reported, session.policy_version, session.completion_tokens,
                        routed=routed,
                        tool_called=session.tool_calls > 0, tool_timed_out=timed_out, asked_at=asked_at,
                        answered_at=answered_at)

    def _http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(verify=self._verify, timeout=self.timeout_s,
                                 headers={"Authorization": f"Bearer {self.api_key}"})

    async def _feedback(self, http: httpx.AsyncClient, interaction_id: str, kpi: str, value: float) -> None:
        """The backend's KPI report through the door's `/v1/feedback` (the body of gRPC's FeedbackRequest)."""
        r = await http.post(f"{self.base_url}/feedback", json={
            "interaction_id": interaction_id, "kind": "kpi", "kpi_name": kpi, "value": value,
            "tenant": self.task.tenant})
        r.raise_for_status()

    async def _run(self, questions: Sequence[tuple[Fact, str]], *, max_new_tokens: int,
                   temperature: float, n: int) -> list[Exchange]:
        from openai import AsyncOpenAI

        http = httpx.AsyncClient(verify=self._verify, timeout=self.timeout_s,
                                 event_hooks={"response": [_capture_interaction]})
        client = AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, max_retries=4,
                             http_client=http)  # type: ignore[arg-type]  # the SDK accepts an httpx client; its annotation names only httpx2's
        try:
            model = self.model or (await client.models.list()).data[0].id
            gate = asyncio.Semaphore(self.concurrency)

            async def one(f: Fact, q: str) -> Exchange:
                async with gate:   # gather runs each in its own task and context: its own `_SESSION`
                    return await self._session(client, model, f, q, max_new_tokens=max_new_tokens,
                                               temperature=temperature)

            # n sessions per message: the same customer message answered n times (independent sessions)
            return list(await asyncio.gather(*(one(f, q) for f, q in questions for _ in range(max(n, 1)))))
        finally:
            await client.close()

    def run(self, questions: Sequence[tuple[Fact, str]], *, max_new_tokens: int, temperature: float,
            n: int = 1) -> list[Exchange]:
        return asyncio.run(self._run(questions, max_new_tokens=max_new_tokens, temperature=temperature, n=n))

    def close(self) -> None:
        self.orders.close()
