"""A service in `record_signatures=required` mode whose private record-signing key is not in its keys
directory stops at start: exit status 2 and ONE line naming APPRENTICE_RECORD_KEYS_DIR, no traceback
(shared/startup.py reports SigningKeyMissing like the other start-up errors).

Why: a deployment that mounted the wrong Secret (another principal's key, only the public keys) must not
run and produce records every consumer dead-letters, nor fall back to writing unsigned ones; the operator
needs the one line that says which variable to fix (docs/operations.md).

Real processes (`apprentice serve NAME`), the real session broker, the tiny real model; the keys directory
holds every other principal's pair and every public key, only the service's own private key is gone."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.contracts.topics import Topics
from shared.kafka.admin import delete_topics, ensure_topics
from shared.kafka.signing import private_key_path
from tests.integration.test_service_startup import SERVICES, assert_one_line_exit, run_to_exit, service_env
from tools import record_keys

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ns(kafka_bootstrap: str) -> Iterator[Topics]:
    t = Topics(prefix=f"test-keyless-{os.urandom(4).hex()}.")
    ensure_topics(kafka_bootstrap, t)
    yield t
    with contextlib.suppress(Exception):
        delete_topics(kafka_bootstrap, [s.name for s in t.specs()])


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_service_without_its_private_key_exits_with_one_line(name: str, ns: Topics, kafka_bootstrap: str,
                                                            tmp_path: Path) -> None:
    keys = tmp_path / "records"
    record_keys.ensure(keys)
    private_key_path(keys, name).unlink()     # the wrong Secret mounted: every key but its own
    env = service_env(SERVICES[name], tmp_path / "home", ns, kafka_bootstrap)
    env.update(APPRENTICE_RECORD_KEYS_DIR=str(keys), APPRENTICE_RECORD_SIGNATURES="required")
    line = assert_one_line_exit(run_to_exit(name, env), name, "APPRENTICE_RECORD_KEYS_DIR", str(keys))
    assert len(line) < 400, line
