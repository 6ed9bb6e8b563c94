"""The light Python client (`clients/python`, distribution `apprentice-client`):

- its committed stubs are what protos/generate.py makes of the current protos;
- its wheel installs into a fresh venv with grpcio and protobuf only (no torch, pydantic, transformers)
  and imports there;
- against the real inference server (keys, TLS, tiny model, real broker) it generates, streams and sends
  feedback as its tenant, with and without a deadline, and the answers are captured with their ids;
- `services.inference.client` still re-exports it.
"""

from __future__ import annotations

import filecmp
import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from tests.clients.conftest import REPO, ClientVenv, Server, run

CLIENT = REPO / "clients" / "python"
COMMITTED = CLIENT / "apprentice_client" / "_proto"
HEAVY = ("torch", "pydantic", "transformers", "numpy", "shared", "services")


def test_committed_stubs_are_current(tmp_path: Path) -> None:
    run([sys.executable, str(REPO / "protos" / "generate.py"), "--out", str(tmp_path), "--package",
         "apprentice_client._proto", "--only", "apprentice/v1/inference.proto"])
    fresh = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    committed = sorted(p.relative_to(COMMITTED) for p in COMMITTED.rglob("*") if p.is_file()
                       and "__pycache__" not in p.parts)
    assert fresh == committed, "regenerate with the command in clients/python/README.md"
    stale = [str(p) for p in fresh if not filecmp.cmp(tmp_path / p, COMMITTED / p, shallow=False)]
    assert not stale, f"stale stubs {stale}: regenerate with the command in clients/python/README.md"


def test_stubs_share_message_classes_with_the_services() -> None:
    """Both copies register the same serialized descriptors, so a process that imports both (the services
    re-export the client) has one class per message."""
    from apprentice_client import inference_pb2 as light

    from services.inference.client import InferenceClient
    from shared.proto.apprentice.v1 import inference_pb2 as full

    assert light.GenerateRequest is full.GenerateRequest
    assert isinstance(InferenceClient.request("hi"), full.GenerateRequest)


def test_wheel_installs_without_the_heavy_dependencies(client_venv: ClientVenv) -> None:
    probe = ("import importlib.util, json, apprentice_client; "
             "from apprentice_client import InferenceClient, inference_pb2; "
             f"print(json.dumps({{m: importlib.util.find_spec(m) is not None for m in {list(HEAVY)!r}}} | "
             "{'version': apprentice_client.__version__, 'file': apprentice_client.__file__}))")
    # the wheel's venv alone: a PYTHONPATH of the caller's (a checkout on the path) would make the repo's
    # heavy dependencies look installed
    alone = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = json.loads(run([str(client_venv.python), "-c", probe], cwd=client_venv.python.parent, env=alone).stdout)
    assert not any(out[m] for m in HEAVY), out
    assert "site-packages" in out["file"] and out["version"] == "0.1.0"
    listed = run([str(client_venv.python), "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
                 env=alone)
    names = {d["name"].lower().replace("_", "-") for d in json.loads(listed.stdout)}
    assert "apprentice-client" in names
    assert names <= {"apprentice-client", "grpcio", "protobuf", "pip", "setuptools", "typing-extensions"}, names


# --- against the real server ----------------------------------------------------------------------
def _client(server: Server, **kw: object):  # noqa: ANN202 - the light client's own type
    from apprentice_client import InferenceClient

    return InferenceClient(server.grpc_target, ca_file=server.creds.ca, **kw)  # type: ignore[arg-type]


@pytest.mark.integration
def test_generate_stream_feedback_over_tls_as_the_keys_tenant(server: Server) -> None:
    from shared.proto.apprentice.v1 import events_pb2
    from tests.helpers.kafka import collect

    with _client(server, api_key=server.key("acme")) as c:
        c.wait_ready(60)
        r = c.generate([{"role": "user", "content": "hello?"}], max_new_tokens=6, temperature=0.9, seed=3, n=2,
                       session_id="sess-light", task="support")      # no timeout: no deadline
        assert len(r.choices) == 2 and r.policy_version == "base"
        chunks = list(c.generate_stream("tell me more", max_new_tokens=5, timeout=60))
        assert chunks[-1].usage.completion_tokens > 0
        iid = r.choices[0].interaction_id
        ack = c.feedback(iid, "thumbs", 1, timeout=30)
        assert ack.accepted and ack.event_id
    ids = [ch.interaction_id for ch in r.choices] + [chunks[0].interaction_id]
    got = {e.interaction_id: e for e in collect(server.bootstrap, server.topics.interactions, events_pb2.Interaction,
                                                want=ids)}
    assert set(ids) <= set(got)
    assert {got[i].envelope.tenant for i in ids} == {"acme"} and got[ids[0]].session_id == server.app.privacy.sessions("acme", "sess-light")
    fb = collect(server.bootstrap, server.topics.feedback, events_pb2.FeedbackEvent, want=[ack.event_id],
                 key=lambda m: m.envelope.event_id)
    assert any(e.interaction_id == iid and e.envelope.tenant == "acme" for e in fb)


@pytest.mark.integration
def test_keys_tenants_and_tls_are_enforced(server: Server) -> None:
    from apprentice_client import InferenceClient

    with _client(server) as anonymous, _client(server, api_key="not-a-key-of-this-server") as wrong:
        for c in (anonymous, wrong):
            with pytest.raises(grpc.RpcError) as e:
                c.generate("hi", max_new_tokens=2, timeout=30)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with _client(server, api_key=server.key("acme"), tenant="globex") as other:
        with pytest.raises(grpc.RpcError) as e:
            other.generate("hi", max_new_tokens=2, timeout=30)
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with _client(server, api_key=server.key("acme")) as acme, _client(server, api_key=server.key("globex")) as globex:
        iid = acme.generate("mine", max_new_tokens=2, timeout=60).choices[0].interaction_id
        with pytest.raises(grpc.RpcError) as e:      # feedback on another tenant's interaction
            globex.feedback(iid, "thumbs", -1, timeout=30)
        assert e.value.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.NOT_FOUND)
    with InferenceClient(server.grpc_target, api_key=server.key("acme"), tls=True) as untrusted:  # system roots
        with pytest.raises(grpc.RpcError) as e:
            untrusted.generate("hi", max_new_tokens=2, timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    with InferenceClient(server.grpc_target, api_key=server.key("acme")) as plaintext:
        with pytest.raises(grpc.RpcError) as e:
            plaintext.generate("hi", max_new_tokens=2, timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.integration
def test_the_installed_wheel_talks_to_the_server(server: Server, client_venv: ClientVenv) -> None:
    """The client as a product backend gets it: only the wheel's venv, no repository on the path."""
    script = ("import json, os, sys; from apprentice_client import InferenceClient\n"
              "with InferenceClient(os.environ['T'], api_key=os.environ['K'], ca_file=os.environ['CA']) as c:\n"
              "    r = c.generate('hi', max_new_tokens=3)\n"
              "    a = c.feedback(r.choices[0].interaction_id, 'rating', 4)\n"
              "print(json.dumps({'text': r.choices[0].text, 'accepted': a.accepted, 'path': sys.path}))\n")
    env = {"T": server.grpc_target, "K": server.key("acme"), "CA": str(server.creds.ca), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([str(client_venv.python), "-c", script], env=env, cwd=client_venv.python.parent,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["accepted"] is True and not any(str(REPO) in p for p in out["path"])
