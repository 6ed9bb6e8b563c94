"""Grader tests and the grader benchmark: build events, run the grader as a real subprocess.

The grader runs exactly as in production (`python -m services.grader`), in its own process group so
that a test can kill -9 it; nothing is mocked. Its output is read with `tests/helpers/kafka.py`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from shared.contracts.events import make_envelope
from shared.proto.apprentice.v1 import common_pb2, events_pb2

REPO = Path(__file__).resolve().parents[2]
"""The repository root: the grader subprocess runs there."""


def interaction(*, tenant: str = "demo", task: str = "support", text: str = "The warranty is 24 months.",
                interaction_id: str | None = None, session_id: str | None = None, policy_version: str = "v1",
                finish_reason: str = "stop", n_tokens: int | None = None, event_id: str | None = None,
                occurred_at: datetime | None = None, group_id: str = "", group_size: int = 0,
                messages: Iterable[tuple[str, str]] = (("user", "How long is the warranty?"),)
                ) -> events_pb2.Interaction:
    n = n_tokens if n_tokens is not None else max(1, len(text.split()))
    return events_pb2.Interaction(
        envelope=make_envelope(tenant, source="test", event_id=event_id, occurred_at=occurred_at or datetime.now(UTC)),
        interaction_id=interaction_id or str(uuid.uuid4()), session_id=session_id or f"s-{uuid.uuid4().hex[:8]}",
        task=task, model="tiny-random", policy_version=policy_version,
        messages=[common_pb2.ChatMessage(role=r, content=c) for r, c in messages],
        response_text=text, response_token_ids=list(range(n)), response_logprobs=[-0.5] * n,
        response_logprobs_t1=[-0.6] * n, finish_reason=finish_reason, group_id=group_id, group_size=group_size)


def feedback(interaction_id: str, *, kind: str = "kpi", value: float = 1.0, kpi_name: str = "",
             comment: str = "", tenant: str = "demo", event_id: str | None = None,
             occurred_at: datetime | None = None) -> events_pb2.FeedbackEvent:
    return events_pb2.FeedbackEvent(envelope=make_envelope(tenant, source="test", event_id=event_id,
                                                           occurred_at=occurred_at),
                                    interaction_id=interaction_id, kind=kind, value=value,
                                    kpi_name=kpi_name or ("resolved" if kind == "kpi" else ""), comment=comment)


class GraderProcess:
    """`python -m services.grader` with the caller's environment plus `env`; logs go to `log_path`."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.env = {**os.environ, **env}
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> GraderProcess:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child until stop()
        self.proc = subprocess.Popen([sys.executable, "-m", "services.grader"], cwd=REPO, env=self.env,
                                     stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        """SIGKILL the whole process group: no flush, no commit, no goodbye."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._close_log()

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, n: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path.exists() else ""

    def first_errors(self, limit: int = 3, chars: int = 2500) -> str:
        """The first `limit` error or critical log lines, each cut to `chars`: after a crash the log's tail
        holds only the shutdown's cancelled tasks, and the cause is the first error logged."""
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        hits = [line[:chars] for line in text.splitlines()
                if '"level": "error"' in line or '"level": "critical"' in line or line.startswith("Traceback")]
        return "\n".join(hits[:limit])

    def exited(self) -> str | None:
        """None while the process runs; once it has exited, its exit status and first errors."""
        if self.proc is None or self.proc.poll() is None:
            return None
        return f"{self.log_path.name} exited with status {self.proc.returncode}; first errors:\n{self.first_errors()}"


def graded(value: bytes) -> events_pb2.GradedInteraction:
    return events_pb2.GradedInteraction.FromString(value)


def grader_env(prefix: str, bootstrap: str, config_path: Path, home: Path, **extra: str) -> dict[str, str]:
    """Environment for a grader subprocess in the namespace `prefix` (metrics off unless given)."""
    env = {"APPRENTICE_TOPIC_PREFIX": prefix, "APPRENTICE_KAFKA_BOOTSTRAP": bootstrap,
           "APPRENTICE_GRADER_CONFIG_PATH": str(config_path), "APPRENTICE_GRADER_METRICS_PORT": "0",
           "APPRENTICE_HOME": str(home), "APPRENTICE_LOG_JSON": "false",
           "APPRENTICE_GRADER_TICK_INTERVAL_S": "0.5", "APPRENTICE_GRADER_BATCH_WITHIN_S": "0.02"}
    env.update({f"APPRENTICE_GRADER_{k.upper()}": v for k, v in extra.items()})
    return env


def delete_namespace(bootstrap: str, prefix: str) -> None:
    """Delete every topic of a namespace, including faust's internal and changelog topics."""
    from shared.kafka.admin import delete_topics, list_topics

    delete_topics(bootstrap, [t for t in list_topics(bootstrap) if t.startswith(prefix)])


def by_interaction(records: Iterable[events_pb2.GradedInteraction], interaction_id: str
                   ) -> list[events_pb2.GradedInteraction]:
    return [r for r in records if r.interaction.interaction_id == interaction_id]
