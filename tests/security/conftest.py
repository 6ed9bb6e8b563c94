"""Fixtures for a secured deployment: development credentials, an environment with authentication, TLS
and signed interaction ids on, channels as each kind of caller, and the real servers started under it.

Function scope (a test that starts its own servers):
- `secure_creds`: `DevCredentials` under `tmp_path` (CA, server certificate, keys file with the operator,
  service and one backend key per tenant of `harness.TENANTS`, interaction-id secret);
- `secure_env`: the same credentials, with the environment set (monkeypatch) so that any server the test
  starts authenticates, listens with TLS, signs interaction ids; returns the `DevCredentials`;
- `dial`: a `harness.Dialer` for those credentials (`.operator(target)`, `.service`, `.backend(target,
  tenant)`, `.anonymous`, `.unknown_key`, `.wrong_ca(target, dir)`, `.plaintext`, `.client_cert(target,
  cn)`); channels are closed after the test.

Module scope (servers shared by a file's tests; the environment is restored after the module):
- `secure_stack`: `SecureStack(creds, topics, bootstrap, dial)`: the credentials, a fresh topic
  namespace on the real broker, the environment set for both;
- `weights_server`, `knowledge_server`, `inference_server`: the real services on loopback under it
  (`.port`); the inference server serves the tiny model with small feedback caps (`FEEDBACK_CAP`) and
  at most 16 new tokens per request.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shared.contracts.topics import Topics
from tests.security.harness import SECURITY_VARS, Dialer, make_credentials, secure_environment
from tools.devca import DevCredentials

FEEDBACK_CAP = 4
"""Feedback events the module's inference server accepts per interaction (small, so a flood test is fast)."""


def _apply(mp: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for name in SECURITY_VARS:
        mp.delenv(name, raising=False)
    for name, value in env.items():
        mp.setenv(name, value)


@pytest.fixture
def secure_creds(tmp_path: Path) -> DevCredentials:
    return make_credentials(tmp_path)


@pytest.fixture
def secure_env(secure_creds: DevCredentials, monkeypatch: pytest.MonkeyPatch) -> DevCredentials:
    _apply(monkeypatch, secure_environment(secure_creds))
    return secure_creds


@pytest.fixture
def dial(secure_creds: DevCredentials) -> Iterator[Dialer]:
    d = Dialer(secure_creds)
    yield d
    d.close()


@dataclass
class SecureStack:
    creds: DevCredentials
    topics: Topics
    bootstrap: str
    dial: Dialer
    home: Path


@pytest.fixture(scope="module")
def secure_stack(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureStack]:
    from shared.kafka.admin import delete_topics, ensure_topics

    home = tmp_path_factory.mktemp("secure")
    creds = make_credentials(home)
    topics = Topics(prefix=f"test-sec-{uuid.uuid4().hex[:8]}.")
    ensure_topics(kafka_bootstrap, topics)
    dialer = Dialer(creds)
    with pytest.MonkeyPatch.context() as mp:
        _apply(mp, secure_environment(creds))
        mp.setenv("APPRENTICE_TOPIC_PREFIX", topics.prefix)
        mp.setenv("APPRENTICE_KAFKA_BOOTSTRAP", kafka_bootstrap)
        yield SecureStack(creds, topics, kafka_bootstrap, dialer, home)
        dialer.close()
    with contextlib.suppress(Exception):   # best effort: a slow broker must not fail the module
        delete_topics(kafka_bootstrap, [s.name for s in topics.specs()])


@pytest.fixture(scope="module")
def weights_server(secure_stack: SecureStack) -> Iterator[Any]:
    from tests.helpers.weights import start_weights

    running = start_weights(secure_stack.home / "weights-store")
    yield running
    running.stop(grace=1.0)


@pytest.fixture(scope="module")
def knowledge_server(secure_stack: SecureStack, tiny_model_name: str) -> Iterator[Any]:
    from tests.security.harness import start_knowledge

    app = start_knowledge(tiny_model_name)
    yield app
    app.stop()


@pytest.fixture(scope="module")
def inference_server(secure_stack: SecureStack, tiny_model_name: str) -> Iterator[Any]:
    from tests.helpers.inference import start_inference

    app = start_inference(secure_stack.home / "inference", model=tiny_model_name, bootstrap=secure_stack.bootstrap,
                          topic_prefix=secure_stack.topics.prefix, follow_updates=False, heartbeat_interval_s=0,
                          feedback={"max_per_interaction": FEEDBACK_CAP}, grace_s=2.0,
                          default_max_new_tokens=4, max_new_tokens_limit=16,   # fuzzed requests stay cheap
                          http_port=0)
    yield app
    app.stop(2)
