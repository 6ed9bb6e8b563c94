"""Attacks on the Weights service (SECURITY.md §4, the Weights rows), replayed against the real server
on loopback, secured as a deployment is (keys, TLS), with the real broker. Each one must fail now:

- an anonymous client uploads a NaN checkpoint, the gate refuses it, Promote(force=true) serves it to every
  tenant, and an anonymous Rollback works too;
- one forged Heartbeat with canary_errors=1 rolls back a gate-approved canary; 2,000 fake pods register;
- names `./x`, `a//b`, model `..` (which wrote the store's state outside models/) are accepted; anyone may
  declare 64 GiB uploads, as many at once as they like;
- and every operator action is on the audit topic, with the caller, before it takes effect.
"""

from __future__ import annotations

import functools
import hashlib
import secrets
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import pytest

from services.weights.service import RunningServer
from shared.audit import AuditLog
from shared.contracts.events import decode, make_envelope
from shared.contracts.topics import Topics
from shared.kafka import EventProducer
from shared.proto.apprentice.v1 import events_pb2, weights_pb2, weights_pb2_grpc
from shared.weights.client import save_version_files, upload_version
from tests.helpers.kafka import read_all
from tests.helpers.signing import signed_producer
from tests.helpers.waiting import wait_for
from tests.helpers.weights import start_weights
from tests.security.harness import Dialer, rpc_error
from tools.devca import DevCredentials

pytestmark = pytest.mark.integration
MODEL = "tiny-random"
W = weights_pb2
Stub = weights_pb2_grpc.WeightsStub

SECOND_SERVICE = ("pods-b", secrets.token_urlsafe(24))
"""A second service credential (another team's pods), accepted next to the development key ring."""


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory, tiny_model_name: str) -> dict[str, Path]:
    """Real tiny checkpoints: the base weights, lightly perturbed ones, and one with a NaN weight."""
    import torch

    from shared.models import load_model

    tmp = tmp_path_factory.mktemp("ckpts")
    out = {}
    for name in ("same", "perturbed", "nan"):
        model, _ = load_model(tiny_model_name)
        with torch.no_grad():
            if name == "perturbed":
                torch.manual_seed(2)
                for p in model.parameters():
                    p.add_(torch.randn_like(p) * 1e-3)
            if name == "nan":
                model.model.layers[0].mlp.up_proj.weight[0, 0] = float("nan")
        save_version_files(model, tmp / name, "full")
        out[name] = tmp / name
    return out


@pytest.fixture
def server(topics: Topics, secure_env: DevCredentials, tmp_path: Path,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningServer]:
    monkeypatch.setenv("APPRENTICE_AUTH_KEYS", f"service:{SECOND_SERVICE[0]}={SECOND_SERVICE[1]}")
    running = start_weights(tmp_path / "store", max_pods_per_identity=40, max_pods=60, heartbeat_timeout_s=60,
                            canary_rollback_min_requests=10, canary_max_error_rate=0.2)
    yield running
    running.stop(grace=1.0)


class Callers:
    """Weights stubs as each kind of caller of `server`."""

    def __init__(self, dial: Dialer, port: int) -> None:
        target = f"127.0.0.1:{port}"
        self.anonymous = Stub(dial.anonymous(target))
        self.operator = Stub(dial.operator(target))
        self.service = Stub(dial.service(target))      # the trainer, the pods: the stack's service key
        self.other_service = Stub(dial.with_token(target, SECOND_SERVICE[1]))
        self.backend = Stub(dial.backend(target))


@pytest.fixture
def who(server: RunningServer, dial: Dialer) -> Callers:
    return Callers(dial, server.port)


def header(**kw: Any) -> W.UploadHeader:
    kw.setdefault("model", MODEL)
    kw.setdefault("kind", "full")
    return W.UploadHeader(**kw)


def audit_records(bootstrap: str, topics: Topics, expect: int) -> list[events_pb2.AuditRecord]:
    return [decode(events_pb2.AuditRecord, r.value())
            for r in read_all(bootstrap, topics.audit, expect=expect, timeout=20)]


def orders(bootstrap: str, topics: Topics, **kw: Any) -> list[events_pb2.ModelUpdate]:
    return [decode(events_pb2.ModelUpdate, r.value()) for r in read_all(bootstrap, topics.model_updates, **kw)]


def approve(server: RunningServer, version: str) -> None:
    """Stands for the eval gate's approval (the gate itself is tested in tests/integration/test_weights_orders.py)."""
    server.service.store.update(MODEL, version, lambda m: setattr(m, "status", W.VERSION_STATUS_APPROVED))


# --- 1. the NaN checkpoint --------------------------------------------------------------------------
def test_nan_checkpoint_cannot_be_forced_into_service(server: RunningServer, who: Callers, topics: Topics,
                                                      kafka_bootstrap: str, checkpoints: dict[str, Path]) -> None:
    # the anonymous client of the attack is refused before any handler runs
    for call in (lambda: upload_version(who.anonymous, header(), checkpoints["nan"]),
                 lambda: who.anonymous.Promote(W.PromoteRequest(model=MODEL, version="v1", force=True)),
                 lambda: who.anonymous.Rollback(W.RollbackRequest(model=MODEL))):
        assert rpc_error(call).code() == grpc.StatusCode.UNAUTHENTICATED
    m = upload_version(who.service, header(), checkpoints["nan"])  # the trainer may upload...

    # ...and promote only through the eval gate, which refuses NaN weights
    e = rpc_error(lambda: who.service.Promote(W.PromoteRequest(model=MODEL, version=m.version), timeout=120))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION and "integrity check" in e.details()
    e = rpc_error(lambda: who.service.Promote(W.PromoteRequest(model=MODEL, version=m.version, force=True)))
    assert e.code() == grpc.StatusCode.PERMISSION_DENIED and "force=true needs an operator key" in e.details()
    # not even an operator can force a model with non-finite weights into service, or roll back onto it
    e = rpc_error(lambda: who.operator.Promote(W.PromoteRequest(model=MODEL, version=m.version, force=True,
                                                                reason="trust me")))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION and "force does not override" in e.details()
    e = rpc_error(lambda: who.operator.Rollback(W.RollbackRequest(model=MODEL, version=m.version)))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION and "integrity check" in e.details()

    assert who.operator.Status(W.StatusRequest(model=MODEL)).promoted_version == "base"
    assert orders(kafka_bootstrap, topics, timeout=3) == []  # no tenant was ever ordered to serve it
    records = audit_records(kafka_bootstrap, topics, expect=4)
    assert [(r.action, r.target, r.allowed, r.envelope.principal.key_id, r.envelope.principal.role)
            for r in records] == [
        ("weights.promote", f"{MODEL}/v1", False, "local-services", "service"),    # refused by the gate
        ("weights.promote", f"{MODEL}/v1", False, "local-services", "service"),    # force without the role
        ("weights.promote", f"{MODEL}/v1", False, "local-operator", "operator"),   # force past NaN
        ("weights.rollback", f"{MODEL}/v1", False, "local-operator", "operator")]
    assert records[1].details["force"] == "true" and "NaN/Inf" in records[2].reason


def test_a_forced_promote_of_a_candidate_runs_the_integrity_check(server: RunningServer, who: Callers,
                                                                  checkpoints: dict[str, Path]) -> None:
    """Force skips the scoring, never the integrity check: a candidate the gate never saw is checked first."""
    bad = upload_version(who.service, header(), checkpoints["nan"])
    good = upload_version(who.service, header(), checkpoints["perturbed"])
    e = rpc_error(lambda: who.operator.Promote(W.PromoteRequest(model=MODEL, version=bad.version, force=True)))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION and "1 of" in e.details()
    got = who.operator.Get(W.GetVersionRequest(model=MODEL, version=bad.version))
    assert got.status == W.VERSION_STATUS_REJECTED and [r.metric for r in got.eval_results] == ["nonfinite_tensors"]
    who.operator.Promote(W.PromoteRequest(model=MODEL, version=good.version, force=True, reason="hotfix"))
    assert who.operator.Status(W.StatusRequest(model=MODEL)).promoted_version == good.version


# --- 2. forged heartbeats ---------------------------------------------------------------------------
def beat(pod: str, canary: str = "v2", requests: int = 0, errors: int = 0, **kw: Any) -> W.PodHeartbeat:
    return W.PodHeartbeat(pod_id=pod, model=MODEL, serving_version="v1", canary_version=canary,
                          tenant_versions={"": "v1"}, tenant_canaries={"": canary}, canary_requests=requests,
                          canary_errors=errors, **kw)


def test_forged_heartbeats_neither_roll_back_a_canary_nor_flood_the_registry(
        server: RunningServer, who: Callers, topics: Topics, kafka_bootstrap: str,
        checkpoints: dict[str, Path]) -> None:
    for name in ("same", "perturbed"):
        upload_version(who.service, header(), checkpoints[name])
    approve(server, "v1")
    approve(server, "v2")
    who.operator.Promote(W.PromoteRequest(model=MODEL, version="v1"))
    who.operator.Canary(W.CanaryRequest(model=MODEL, version="v2", fraction=0.5))
    canary = lambda: who.operator.Status(W.StatusRequest(model=MODEL)).canary_version  # noqa: E731

    # only service credentials report as pods
    assert rpc_error(lambda: who.anonymous.Heartbeat(beat("p", requests=1, errors=1))).code() == \
        grpc.StatusCode.UNAUTHENTICATED
    for stub in (who.operator, who.backend):
        assert rpc_error(partial(stub.Heartbeat, beat("p", requests=1, errors=1))).code() == \
            grpc.StatusCode.PERMISSION_DENIED
    # the attack's forged report, now even with a service key: one failed request is not evidence
    who.service.Heartbeat(beat("pod-0", requests=1, errors=1, last_error="boom"))
    assert canary() == "v2"
    e = rpc_error(lambda: who.service.Heartbeat(beat("pod-1", requests=1, errors=3)))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "cannot exceed canary_requests" in e.details()
    # another credential cannot speak for a registered pod
    e = rpc_error(lambda: who.other_service.Heartbeat(beat("pod-0", requests=50, errors=50)))
    assert e.code() == grpc.StatusCode.PERMISSION_DENIED and "registered by another credential" in e.details()

    # a flood of fake pods stops at the caps: 40 per credential, 60 in all
    def flood(stub: Stub, prefix: str) -> tuple[int, grpc.RpcError]:
        for i in range(1000):
            try:
                stub.Heartbeat(beat(f"{prefix}-{i}", canary=""))
            except grpc.RpcError as err:
                return i, err
        raise AssertionError("1000 fake pods registered")

    started = time.monotonic()
    n, e = flood(who.service, "fake")
    assert n == 39 and e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # pod-0 was the first of 40
    assert "APPRENTICE_WEIGHTS_MAX_PODS_PER_IDENTITY" in e.details()
    n, e = flood(who.other_service, "other")
    assert n == 20 and e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "APPRENTICE_WEIGHTS_MAX_PODS)" in e.details()
    assert len(who.operator.Status(W.StatusRequest(model=MODEL)).pods) == 60
    assert time.monotonic() - started < 60
    assert canary() == "v2" and len(orders(kafka_bootstrap, topics, expect=3, timeout=3)) == 2  # no rollback

    # real failures, from several requests summed over pods, do roll the canary back: 3 of 12 = 25% > 20%
    who.service.Heartbeat(beat("pod-0", requests=6, errors=2, last_error="NaN logits"))
    assert canary() == "v2"  # 6 requests so far (a pod's report replaces its last): below the minimum of 10
    who.other_service.Heartbeat(beat("other-0", requests=6, errors=1))
    wait_for(lambda: canary() == "", what="the canary rolled back", stall_s=10)
    last = orders(kafka_bootstrap, topics, expect=3)[-1]
    assert (last.action, last.version) == (events_pb2.UPDATE_ACTION_ROLLBACK, "v1")
    assert "3 of 12 requests failed on 2 pods" in last.reason
    rollback = [r for r in audit_records(kafka_bootstrap, topics, expect=3) if r.action == "weights.rollback"]
    assert len(rollback) == 1 and rollback[0].allowed
    assert (rollback[0].envelope.principal.key_id, rollback[0].envelope.principal.role) == ("weights", "service")


# --- 3. names, paths and upload quotas --------------------------------------------------------------
def _entry(path: str, data: bytes = b"x") -> W.FileEntry:
    return W.FileEntry(path=path, size=len(data), sha256=hashlib.sha256(data).hexdigest())


def _stream(h: W.UploadHeader, gate: threading.Event | None = None) -> Iterator[W.UploadRequest]:
    """The header, then (once `gate` is set, if given) one chunk per declared file."""
    yield W.UploadRequest(header=h)
    if gate is not None:
        gate.wait(60)
    for f in h.files:
        yield W.UploadRequest(chunk=W.FileChunk(path=f.path, offset=0, data=b"x"))


@pytest.mark.parametrize(("fields", "message"), [
    ({"model": ".."}, "model name '..' is not allowed"),
    ({"model": "/../etc"}, "model name '/../etc' is not allowed"),
    ({"files": [_entry("./x")]}, "file path './x' must be relative"),
    ({"files": [_entry("a//b")]}, "file path 'a//b' must be relative"),
    ({"files": [_entry("a\\b")]}, "must be relative"),
    ({"version": ".."}, "version '..' must match"),
    ({"tenant": "../../x"}, "tenant '../../x' is not allowed"),
])
def test_bad_names_are_refused_and_nothing_leaves_the_store(server: RunningServer, who: Callers,
                                                            fields: dict[str, Any], message: str) -> None:
    h = header(**{"files": [_entry("model.safetensors")], **fields})
    e = rpc_error(lambda: who.service.Upload(_stream(h)))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and message in e.details()
    root = server.service.store.root
    assert not (root / "state.json").exists() and not (root / "versions").exists()  # where `..` used to write
    assert list((root / "models").iterdir()) == []


def test_names_in_other_calls(server: RunningServer, who: Callers) -> None:
    for call, message in (
            (lambda: who.operator.Rollback(W.RollbackRequest(model=MODEL, tenant="../x")), "tenant '../x'"),
            (lambda: who.operator.List(W.ListVersionsRequest(model="..")), "model name '..'"),
            (lambda: who.operator.Pin(W.PinRequest(model=MODEL, version="../v1", pinned=True)), "version '../v1'"),
            (lambda: who.service.Heartbeat(W.PodHeartbeat(pod_id="../p", model=MODEL)), "pod_id '../p'"),
            (lambda: who.service.Heartbeat(W.PodHeartbeat(pod_id="p", model=MODEL, tenant_versions={"a/b": "v1"})),
             "tenant_versions key 'a/b'")):
        e = rpc_error(call)
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and message in e.details()


def test_upload_quotas(server: RunningServer, who: Callers, checkpoints: dict[str, Path]) -> None:
    huge = W.FileEntry(path="model.safetensors", size=65 << 30, sha256="0" * 64)
    e = rpc_error(lambda: who.service.Upload(_stream(header(files=[huge]))))
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "per upload" in e.details()

    # two uploads in flight per credential; the third is refused until one ends
    release = threading.Event()
    held = [who.service.Upload.future(_stream(header(files=[_entry("w.safetensors")]), release), timeout=60)
            for _ in range(2)]
    quotas = server.service.quotas
    wait_for(lambda: quotas.in_flight("local-services")[0] == 2, what="two uploads in flight", stall_s=10)
    e = rpc_error(lambda: who.service.Upload(_stream(header(files=[_entry("w.safetensors")]))))
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "already has 2 uploads in flight" in e.details()
    # another credential is not starved by it
    assert upload_version(who.operator, header(), checkpoints["same"]).version == "v1"
    release.set()
    assert sorted(f.result().version for f in held) == ["v2", "v3"]
    assert quotas.in_flight("local-services") == (0, 0) and quotas.total_bytes == 0
    assert who.service.Upload(_stream(header(files=[_entry("w.safetensors")]))).version == "v4"


# --- 4. the audit trail -----------------------------------------------------------------------------
def test_operator_actions_are_audited_before_they_act(server: RunningServer, who: Callers, topics: Topics,
                                                      kafka_bootstrap: str, checkpoints: dict[str, Path],
                                                      secure_env: DevCredentials,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("same", "perturbed"):
        upload_version(who.service, header(), checkpoints[name])
    approve(server, "v1")
    approve(server, "v2")
    op = who.operator
    op.Promote(W.PromoteRequest(model=MODEL, version="v1", reason="first"))
    op.Canary(W.CanaryRequest(model=MODEL, version="v2", fraction=0.25))
    op.Rollback(W.RollbackRequest(model=MODEL, reason="worse answers"))
    op.Promote(W.PromoteRequest(model=MODEL, version="v2", force=True, reason="the metric was wrong"))
    op.Pin(W.PinRequest(model=MODEL, version="v1", pinned=True))
    # the CLI, as an operator of the secured stack
    from services.weights.cli import main

    monkeypatch.setenv("APPRENTICE_WEIGHTS_ENDPOINT", f"127.0.0.1:{server.port}")
    for name, value in secure_env.client_env().items():
        monkeypatch.setenv(name, value)
    assert main(["--model", MODEL, "unpin", "v1"]) == 0
    monkeypatch.setenv("APPRENTICE_AUTH_TOKEN_FILE", str(secure_env.service_token))
    assert main(["--model", MODEL, "promote", "v1", "--force"]) == 1
    assert "PERMISSION_DENIED" in capsys.readouterr().err

    records = audit_records(kafka_bootstrap, topics, expect=7)
    assert [(r.action, r.target, r.allowed, r.envelope.principal.key_id) for r in records] == [
        ("weights.promote", f"{MODEL}/v1", True, "local-operator"),
        ("weights.canary", f"{MODEL}/v2", True, "local-operator"),
        ("weights.rollback", f"{MODEL}/v1", True, "local-operator"),
        ("weights.promote", f"{MODEL}/v2", True, "local-operator"),
        ("weights.pin", f"{MODEL}/v1", True, "local-operator"),
        ("weights.unpin", f"{MODEL}/v1", True, "local-operator"),
        ("weights.promote", f"{MODEL}/v1", False, "local-services")]
    assert records[0].reason == "first" and records[0].details["force"] == "false"
    assert records[1].details["fraction"] == "0.25" and records[2].details["replaced"] == "v2"
    assert records[3].details["force"] == "true" and records[3].envelope.principal.role == "operator"

    # no record, no action: with the audit topic unreachable, nothing changes and the caller may retry
    dead = EventProducer("127.0.0.1:1", client_id="audit-unreachable", extra_config={"log_level": 0})
    server.service._audit_log = AuditLog(dead, topics, source="weights", timeout_s=2)
    try:
        before = len(orders(kafka_bootstrap, topics, expect=4))
        for call in (lambda: op.Promote(W.PromoteRequest(model=MODEL, version="v1")),
                     lambda: op.Rollback(W.RollbackRequest(model=MODEL)),
                     lambda: op.Pin(W.PinRequest(model=MODEL, version="v2", pinned=True))):
            e = rpc_error(call)
            assert e.code() == grpc.StatusCode.UNAVAILABLE and "not written" in e.details()
        st = op.Status(W.StatusRequest(model=MODEL))
        assert st.promoted_version == "v2"
        assert not op.Get(W.GetVersionRequest(model=MODEL, version="v2")).pinned
        assert len(orders(kafka_bootstrap, topics, timeout=3)) == before
    finally:
        server.service._audit_log = None
        dead.close(timeout=0.1)



# --- pickles and empty checkpoints -------------------------------------------------------------------------
def test_pickle_checkpoints_are_refused_and_a_tensorless_one_fails_integrity(
        server: RunningServer, who: Callers, checkpoints: dict[str, Path], tmp_path: Path) -> None:
    """Attack: the NaN model saved as `pytorch_model.bin` passed the integrity check ("0 of 0 tensors"), which
    read only `*.safetensors`, and could be force-promoted; the loaders load `.bin` too, and a pickle runs code
    when loaded. Now every pickle-bearing file is refused at upload, and no tensor file fails integrity."""
    import shutil

    import torch
    from safetensors.torch import load_file

    nan_dir = checkpoints["nan"]
    state = {}
    for f in nan_dir.glob("*.safetensors"):
        state.update(load_file(str(f)))
    for suffix in ("bin", "pt", "pth", "ckpt", "pkl"):
        pickled = tmp_path / f"pickled-{suffix}"
        pickled.mkdir()
        for f in nan_dir.iterdir():
            if f.suffix != ".safetensors" and f.name != "model.safetensors.index.json":
                shutil.copy(f, pickled / f.name)
        torch.save(state, pickled / f"pytorch_model.{suffix}")
        err = rpc_error(functools.partial(upload_version, who.service, header(), pickled))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (suffix, err.details())
        assert "safetensors" in (err.details() or ""), err.details()
    empty = tmp_path / "no-tensors"
    empty.mkdir()
    shutil.copy(nan_dir / "config.json", empty / "config.json")
    m = upload_version(who.service, header(), empty)
    e = rpc_error(lambda: who.operator.Promote(W.PromoteRequest(model=MODEL, version=m.version, force=True,
                                                                reason="it is only config"), timeout=120))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION and "integrity" in (e.details() or ""), e.details()


# --- forged checkpoint events (issue #33 item 2) -----------------------------------------------------------
def test_forged_checkpoint_events_are_not_registered(server: RunningServer, who: Callers, topics: Topics,
                                                     kafka_bootstrap: str, checkpoints: dict[str, Path]) -> None:
    """A CheckpointPublished not signed by the trainer (unsigned, signed by the grader, signed by weights
    itself) is never evaluated nor promoted: the checkpoint consumer dead-letters it with the reason."""
    # the fixture's server runs without its checkpoint consumer (tests/helpers/weights.py): start it here,
    # it stops with the server
    threading.Thread(target=server.service._consume_loop, name="test-checkpoints", daemon=True).start()
    m = upload_version(who.service, header(), checkpoints["perturbed"])
    before = who.operator.Get(W.GetVersionRequest(model=MODEL, version=m.version))
    ev = events_pb2.CheckpointPublished(envelope=make_envelope("default", source="trainer"), model=MODEL,
                                        version=m.version, kind="full", tenant=m.tenant)
    producers = [EventProducer(kafka_bootstrap, client_id="test-unsigned"),
                 signed_producer(kafka_bootstrap, "grader"), signed_producer(kafka_bootstrap, "weights")]
    for p in producers:
        p.produce(topics.checkpoints, MODEL, ev)
        p.flush(10)
        p.close()

    def refused() -> list[events_pb2.DeadLetter]:
        return [d for r in read_all(kafka_bootstrap, topics.deadletter, timeout=5, idle=1.0)
                if "untrusted record" in (d := decode(events_pb2.DeadLetter, r.value())).reason]
    dead = wait_for(lambda: (d := refused()) and len(d) >= 3 and d, what="three refused checkpoint events")
    for d in dead:
        print(f"dead letter: stage={d.stage} reason={d.reason}")
    reasons = " | ".join(d.reason for d in dead)
    assert "unsigned" in reasons and "grader may not write" in reasons and "weights may not write" in reasons
    after = who.operator.Get(W.GetVersionRequest(model=MODEL, version=m.version))
    assert after.status == before.status and not after.eval_results     # never evaluated nor promoted
    assert orders(kafka_bootstrap, topics, timeout=3) == []
