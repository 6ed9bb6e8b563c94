"""The gRPC door at start-up and without a deadline: every service, started as `apprentice serve NAME`
in its own process, exits with status 2 and ONE line naming the problem (no traceback) when its gRPC or
metrics port is taken or its security settings cannot work; a Generate call that carries no deadline
(grpcurl's, Go's and Java's default) is served.

Real processes, the real broker, the tiny real model. A port is taken either by a running instance of
the same service (inference: the case that used to split traffic between two processes) or by a plain
listening socket held by the test.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from shared.contracts.topic_access import ADMIN
from shared.contracts.topics import Topics
from shared.kafka.admin import admin, broker_answers
from shared.proto.apprentice.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from shared.startup import EXIT_STARTUP_ERROR
from tests.helpers.ports import free_port
from tests.helpers.waiting import wait_for
from tools.broker.acls import apply_acls, grants
from tools.broker.local_broker import local_credentials_dir, principal_env, principal_security

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 240.0   # a cold start imports torch and faust on a busy 2-core machine


@dataclass(frozen=True)
class Service:
    name: str
    grpc_port_env: str | None          # None: the service has no gRPC server (grader, trainer)
    metrics_port_env: str


SERVICES = {
    "inference": Service("inference", "APPRENTICE_INFERENCE_PORT", "APPRENTICE_INFERENCE_METRICS_PORT"),
    "weights": Service("weights", "APPRENTICE_WEIGHTS_PORT", "APPRENTICE_WEIGHTS_METRICS_PORT"),
    "extractor": Service("extractor", "APPRENTICE_EXTRACTOR_PORT", "APPRENTICE_EXTRACTOR_METRICS_PORT"),
    "grader": Service("grader", None, "APPRENTICE_GRADER_METRICS_PORT"),
    "trainer": Service("trainer", None, "APPRENTICE_TRAINER_METRICS_PORT"),
}


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port this test holds with a listening socket (SO_REUSEPORT off) for the whole test."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def service_env(svc: Service, home: Path, topics: Topics, bootstrap: str, **ports: int) -> dict[str, str]:
    """A process environment for `svc` on free ports (override with `grpc=`/`metrics=`), its own home,
    the test's topics, the tiny model, no keys and loopback (unless the test adds them)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPRENTICE_")}
    env.update(APPRENTICE_HOME=str(home), APPRENTICE_MODEL="tiny-random", APPRENTICE_KAFKA_BOOTSTRAP=bootstrap,
               APPRENTICE_TOPIC_PREFIX=topics.prefix, APPRENTICE_LOG_JSON="false", PYTHONUNBUFFERED="1",
               APPRENTICE_TORCH_THREADS="1")
    sasl_dir = local_credentials_dir(os.environ)      # the session broker's: the service as its own principal
    if sasl_dir is not None:                           # ... with the ACLs of the test's namespace
        security = principal_security(sasl_dir, ADMIN)
        if broker_answers(bootstrap, 5.0, security=security):   # not for a test that points at no broker
            apply_acls(admin(bootstrap, security=security), grants(topics))
        env.update(principal_env(sasl_dir, svc.name))
    env[svc.metrics_port_env] = str(ports.get("metrics", free_port()))
    if svc.grpc_port_env:
        env[svc.grpc_port_env] = str(ports.get("grpc", free_port()))
    if svc.name == "inference":
        env.update(APPRENTICE_INFERENCE_HTTP_PORT="0", APPRENTICE_INFERENCE_FOLLOW_UPDATES="false",
                   APPRENTICE_INFERENCE_HEARTBEAT_INTERVAL_S="0", APPRENTICE_INFERENCE_HOST="127.0.0.1")
    if svc.name == "trainer":
        env["APPRENTICE_TRAINER_WEIGHTS_ENDPOINT"] = "127.0.0.1:1"
    return env


def serve_cmd(name: str) -> list[str]:
    return [sys.executable, "-m", "tools.cli.main", "serve", name]


def run_to_exit(name: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`apprentice serve NAME` until it exits by itself (it must: the test fails on the timeout)."""
    return subprocess.run(serve_cmd(name), env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=START_TIMEOUT_S)


def assert_one_line_exit(proc: subprocess.CompletedProcess[str], name: str, *needles: str) -> str:
    """Status 2, exactly one `apprentice NAME: ...` line containing every needle, no traceback."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == EXIT_STARTUP_ERROR, f"exit {proc.returncode}; output:\n{out[-4000:]}"
    assert "Traceback" not in out, out[-4000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith(f"apprentice {name}: ")]
    assert len(lines) == 1, proc.stderr[-4000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# --- a second process on a taken port ----------------------------------------------------------------
@pytest.fixture(scope="module")
def ns(kafka_bootstrap: str) -> Iterator[Topics]:
    import contextlib

    from shared.kafka.admin import delete_topics, ensure_topics

    t = Topics(prefix=f"test-door-{os.urandom(4).hex()}.")
    ensure_topics(kafka_bootstrap, t)
    yield t
    with contextlib.suppress(Exception):
        delete_topics(kafka_bootstrap, [s.name for s in t.specs()])


@dataclass
class Running:
    port: int
    metrics_port: int
    proc: subprocess.Popen[str]


@pytest.fixture(scope="module")
def first_inference(ns: Topics, kafka_bootstrap: str, tiny_model_name: str,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """`apprentice serve inference` (tiny model), SERVING."""
    home = tmp_path_factory.mktemp("first-inference")
    port, metrics = free_port(), free_port()
    env = service_env(SERVICES["inference"], home, ns, kafka_bootstrap, grpc=port, metrics=metrics)
    log = (home / "out.log").open("w")
    proc = subprocess.Popen(serve_cmd("inference"), env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            text=True)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            health = health_pb2_grpc.HealthStub(ch)

            def serving() -> bool:
                assert proc.poll() is None, (home / "out.log").read_text()[-4000:]
                r = health.Check(health_pb2.HealthCheckRequest(service="apprentice.v1.Inference"), timeout=2)
                return bool(r.status == health_pb2.HealthCheckResponse.SERVING)

            wait_for(serving, what="the first inference SERVING", stall_s=START_TIMEOUT_S, every=0.2,
                     ignore=(grpc.RpcError,))
        yield Running(port, metrics, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_second_inference_on_a_taken_grpc_port_exits_and_the_first_keeps_serving(
        first_inference: Running, ns: Topics, kafka_bootstrap: str, tmp_path: Path) -> None:
    env = service_env(SERVICES["inference"], tmp_path, ns, kafka_bootstrap, grpc=first_inference.port)
    proc = run_to_exit("inference", env)
    assert_one_line_exit(proc, "inference", "cannot bind gRPC port", f":{first_inference.port}", "in use")
    assert first_inference.proc.poll() is None
    with grpc.insecure_channel(f"127.0.0.1:{first_inference.port}") as ch:
        r = inference_pb2_grpc.InferenceStub(ch).Generate(inference_pb2.GenerateRequest(
            prompt="still there?", sampling=common_pb2.SamplingParams(max_new_tokens=2)), timeout=60)
    assert r.choices and r.choices[0].token_count > 0


def test_second_inference_on_a_taken_metrics_port_exits(first_inference: Running, ns: Topics,
                                                         kafka_bootstrap: str, tmp_path: Path) -> None:
    env = service_env(SERVICES["inference"], tmp_path, ns, kafka_bootstrap, metrics=first_inference.metrics_port)
    proc = run_to_exit("inference", env)
    assert_one_line_exit(proc, "inference", "metrics port", f":{first_inference.metrics_port}")


@pytest.mark.parametrize("name", ["weights", "extractor", "grader", "trainer"])
def test_service_on_a_taken_port_exits_with_one_line(name: str, held_port: int, ns: Topics, kafka_bootstrap: str,
                                                     tmp_path: Path) -> None:
    """gRPC port where the service has one, else its metrics port."""
    svc = SERVICES[name]
    which = "grpc" if svc.grpc_port_env else "metrics"
    env = service_env(svc, tmp_path, ns, kafka_bootstrap, **{which: held_port})
    proc = run_to_exit(name, env)
    needle = "cannot bind gRPC port" if which == "grpc" else "cannot bind the metrics port"
    assert_one_line_exit(proc, name, needle, f":{held_port}")


# --- security settings that cannot work --------------------------------------------------------------
@pytest.mark.parametrize(("name", "extra", "needles"), [
    ("inference", {"APPRENTICE_INFERENCE_HOST": "0.0.0.0"}, ("refusing to bind 0.0.0.0 without authentication",
                                                             "APPRENTICE_AUTH_KEYS")),
    ("weights", {"APPRENTICE_AUTH_KEYS": "backend:acme-1=short"}, ("APPRENTICE_AUTH_KEYS", "must name its tenant")),
    ("extractor", {"APPRENTICE_TLS_CERT": "/nonexistent/server.pem"},
     ("set both APPRENTICE_TLS_CERT and APPRENTICE_TLS_KEY",)),
    ("grader", {"APPRENTICE_AUTH_KEYS": "operator:ops=too-short"}, ("APPRENTICE_AUTH_KEYS", "at least 16")),
    ("trainer", {"APPRENTICE_TLS_CERT": "/nonexistent/server.pem", "APPRENTICE_TLS_KEY": "/nonexistent/server.key"},
     ("cannot read TLS", "/nonexistent/")),
], ids=["inference-insecure-bind", "weights-bad-key", "extractor-tls-pair", "grader-short-key",
        "trainer-missing-tls-file"])
def test_invalid_security_settings_exit_with_one_line(name: str, extra: dict[str, str], needles: tuple[str, ...],
                                                      ns: Topics, kafka_bootstrap: str, tmp_path: Path) -> None:
    env = service_env(SERVICES[name], tmp_path, ns, kafka_bootstrap)
    env.update(extra)
    proc = run_to_exit(name, env)
    assert_one_line_exit(proc, name, *needles)


# --- no deadline ------------------------------------------------------------------------------------
def test_generate_without_a_deadline_is_served(first_inference: Running) -> None:
    """A raw stub with no timeout sends no grpc-timeout header (gRPC's "infinite" deadline), as grpcurl
    and the generated Go/Java/Node stubs do by default. The test's own wait is bounded instead."""
    with grpc.insecure_channel(f"127.0.0.1:{first_inference.port}") as ch:
        stub = inference_pb2_grpc.InferenceStub(ch)
        req = inference_pb2.GenerateRequest(
            messages=[common_pb2.ChatMessage(role="user", content="no deadline")],
            sampling=common_pb2.SamplingParams(max_new_tokens=3, n=2, temperature=1.0, seed=1))
        unary = stub.Generate.future(req)
        stream = stub.GenerateStream(req)
        watchdog = threading.Timer(120, stream.cancel)   # bounds the test, not the call
        watchdog.start()
        try:
            r = unary.result(timeout=120)
            chunks = list(stream)
        finally:
            watchdog.cancel()
    assert len(r.choices) == 2 and all(c.token_count > 0 and c.interaction_id for c in r.choices)
    assert chunks and chunks[-1].usage.completion_tokens > 0
