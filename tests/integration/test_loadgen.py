"""`load/loadgen.py` against the real inference server (tiny model, real broker, keys and TLS on, the
OpenAI-compatible HTTP API on): open-loop load over gRPC and over HTTP is served and captured, feedback is
sent, and a target rate the server cannot reach is reported with the rate achieved.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from load.loadgen import main
from shared.contracts.topics import Topics
from shared.kafka.admin import delete_topics, ensure_topics
from shared.proto.apprentice.v1 import events_pb2
from tests.helpers.inference import start_inference
from tests.helpers.kafka import collect
from tests.helpers.ports import free_port
from tests.security.harness import SECURITY_VARS
from tools.devca import DevCredentials, ensure_dev_credentials

pytestmark = pytest.mark.integration


@dataclass
class Target:
    app: Any
    creds: DevCredentials
    topics: Topics

    def args(self, protocol: str) -> list[str]:
        port = self.app.port if protocol == "grpc" else self.app.http_port
        return ["--protocol", protocol, "--target", f"localhost:{port}", "--ca", str(self.creds.ca),
                "--api-key-file", str(self.creds.backend_token("acme")), "--tenants", "acme", "--json"]


@pytest.fixture(scope="module")
def target(kafka_bootstrap: str, tiny_model_name: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    home = tmp_path_factory.mktemp("loadgen")
    creds = ensure_dev_credentials(home, tenants=("acme",))
    topics = Topics(prefix=f"test-load-{uuid.uuid4().hex[:8]}.")
    ensure_topics(kafka_bootstrap, topics)
    with pytest.MonkeyPatch.context() as mp:
        for name in SECURITY_VARS:
            mp.delenv(name, raising=False)
        mp.setenv("APPRENTICE_AUTH_KEYS_FILE", str(creds.keys_file))
        mp.setenv("APPRENTICE_TLS_CERT", str(creds.server_cert))
        mp.setenv("APPRENTICE_TLS_KEY", str(creds.server_key))
        mp.setenv("APPRENTICE_INTERACTION_ID_SECRET_FILE", str(creds.interaction_id_secret))
        app = start_inference(home, model=tiny_model_name, bootstrap=kafka_bootstrap, topic_prefix=topics.prefix,
                              http_port=free_port(), follow_updates=False, heartbeat_interval_s=0)
        try:
            yield Target(app, creds, topics)
        finally:
            app.stop(2)
            with contextlib.suppress(Exception):
                delete_topics(kafka_bootstrap, [s.name for s in topics.specs()])


@pytest.mark.parametrize("protocol", ["grpc", "openai"])
def test_open_loop_load_is_served_captured_and_fed_back(protocol: str, target: Target, kafka_bootstrap: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    code = main([*target.args(protocol), "--qps", "4", "--duration", "3", "--max-new-tokens", "4",
                 "--feedback-rate", "1", "--feedback-delay", "0.2", "--seed", "5"])
    out, err = capsys.readouterr()
    s = json.loads(out.strip().splitlines()[-1])
    assert code == 0, (s, err)
    assert s["errors"] == {} and s["failed"] == {} and s["target_qps"] == 4
    assert s["requests_ok"] == s["issued"] >= 3 and s["skipped"] == 0
    assert s["feedback_sent"] == s["requests_ok"] and s["versions"] == {"base": s["requests_ok"]}
    got = collect(kafka_bootstrap, target.topics.interactions, events_pb2.Interaction, count=s["requests_ok"],
                  timeout=30)
    assert len(got) >= s["requests_ok"] and {e.envelope.tenant for e in got} == {"acme"}


def test_an_unreachable_rate_is_reported_with_the_rate_achieved(target: Target,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code = main([*target.args("grpc"), "--qps", "40", "--duration", "2", "--max-in-flight", "1",
                 "--max-new-tokens", "48", "--feedback-rate", "0"])
    out, err = capsys.readouterr()
    s = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and s["skipped"] > 0 and s["achieved_rps"] < 40
    assert "loadgen: warning: --max-in-flight 1 calls outstanding" in err
    assert f"target 40 req/s not reached: achieved {s['achieved_rps']:.2f} req/s answered" in err
