"""`apprentice up`, `apprentice status`, `apprentice down` as a user runs them (real processes, the real
broker, tiny model), on an isolated APPRENTICE_HOME, topic namespace and free ports: status reports
health, pid and restarts per service, what the inference pod serves, consumer lag, spool depth and
knowledge; a service killed with -9 is restarted by the supervisor and status shows the restart; down
stops every process it started and leaves alone the broker it did not start."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from shared.contracts.topics import Topics
from shared.kafka.admin import broker_answers
from tests.helpers.cli_stack import cli_stack
from tests.helpers.waiting import wait_for
from tools.stack.ports import Ports

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie still answers kill(pid, 0); its /proc status says so
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def test_up_status_kill_restart_down(kafka_bootstrap: str, topics: Topics, tiny_model_name: str,
                                     tmp_path: Path) -> None:
    stack = cli_stack(tmp_path, tiny_model_name, "pod-up")
    ports, home, apprentice, status = stack.ports, stack.home, stack.apprentice, stack.status

    try:
        up = apprentice("up", "--wait", "240", timeout=300)
        assert up.returncode == 0, up.stdout + up.stderr
        # not a terminal: start-up progress as plain lines (which services are still starting), no bar
        assert re.search(r"^apprentice up: \d/5 healthy after \d+s; ", up.stderr, re.M), up.stderr
        assert "\r" not in up.stderr and "\x1b" not in up.stderr
        assert "inference  healthy" in up.stdout and "pod pod-up: serving base" in up.stdout, up.stdout
        # every CLI command finds this stack (its free ports, model, prefix, CA and key) from its home alone
        recorded = json.loads((home / "endpoints.json").read_text())
        assert recorded["grpc"]["weights"] == f"127.0.0.1:{ports.weights}" and recorded["model"] == tiny_model_name
        listed = apprentice("weights", "list")
        assert listed.returncode == 0 and listed.stdout.startswith(f"only the base model {tiny_model_name};"), \
            listed.stdout + listed.stderr
        kb = apprentice("knowledge", "list")
        assert kb.returncode == 0 and "reading the knowledge topic" not in kb.stderr, kb.stdout + kb.stderr

        st = status()
        assert st["broker"] == {"bootstrap": kafka_bootstrap, "up": True}
        assert st["supervisor"]["ports"] == ports.as_dict()         # the ports `up` was given, read back
        assert set(st["services"]) == {"inference", "grader", "extractor", "trainer", "weights"}
        for name, s in st["services"].items():
            assert s["healthy"] and isinstance(s["pid"], int) and _alive(s["pid"]), (name, s)
            assert s["restarts"] == 0 and s["exits"] == [], (name, s)
            assert Path(s["log"]).parent == home / "logs" and Path(s["log"]).stat().st_size > 0
        assert st["pods"]["pods"]["pod-up"]["serving"] in ("", "base"), st["pods"]
        assert st["pods"]["promoted"] in ("", "base") and not st["pods"]["pods"]["pod-up"]["lagging"]
        assert st["knowledge"] == {}                                  # no knowledge base yet
        assert st["spool_depth"] == 0.0

        # one served request, as a product backend with the stack's development key and CA (TLS on):
        # its interaction becomes consumer lag or a commit of the grader's group
        import grpc

        from shared.proto.apprentice.v1 import common_pb2, inference_pb2, inference_pb2_grpc
        from shared.security.channels import open_channel
        from shared.settings import CommonSettings
        secrets = home / "secrets"
        with grpc.insecure_channel(f"127.0.0.1:{ports.inference}") as plain, pytest.raises(grpc.RpcError):
            # plaintext: refused by the TLS server
            inference_pb2_grpc.InferenceStub(plain).Generate(inference_pb2.GenerateRequest(prompt="x"), timeout=5)
        client = CommonSettings(tls_ca=secrets / "ca.pem", auth_token_file=secrets / "backend-default.token")
        with open_channel(f"127.0.0.1:{ports.inference}", client) as ch:
            resp = inference_pb2_grpc.InferenceStub(ch).Generate(inference_pb2.GenerateRequest(
                messages=[common_pb2.ChatMessage(role="user", content="hello")], task="support",
                sampling=common_pb2.SamplingParams(max_new_tokens=4)), timeout=60)
        assert resp.policy_version == "base" and resp.choices[0].interaction_id
        _openai_sdks_against_the_stack(home, ports, topics, kafka_bootstrap, tiny_model_name)

        def lag_on_interactions() -> dict[str, Any] | None:
            lag = status().get("lag") or {}
            groups = {g: t for g, t in lag.items() if isinstance(t, dict) and topics.interactions in t}
            return groups or None

        groups = wait_for(lag_on_interactions, what="a consumer group committed on the interactions topic",
                          stall_s=90, every=2.0)
        assert all(isinstance(n, int) and n >= 0 for t in groups.values() for n in t.values()), groups

        # kill -9 one service: the supervisor restarts it and status shows the restart
        victim = st["services"]["weights"]["pid"]
        os.kill(victim, signal.SIGKILL)

        def restarted() -> dict[str, Any] | None:
            s = status()["services"]["weights"]
            return s if s["healthy"] and s["restarts"] == 1 and s["pid"] not in (None, victim) else None

        w = wait_for(restarted, what="weights healthy again after kill -9", stall_s=120, every=2.0)
        assert w["exits"] == [-signal.SIGKILL]
        # the restarted store knows the pod again from its next heartbeat (every 3 s)
        after = wait_for(lambda: (lambda s: s if "pod-up" in (s["pods"].get("pods") or {}) else None)(status()),
                         what="the pod re-registered with the restarted weights service", stall_s=60, every=2.0)
        assert all(s["healthy"] for s in after["services"].values()), after["services"]
        text = apprentice("status")
        print(text.stdout)
        row = next(line for line in text.stdout.splitlines() if line.startswith("weights "))
        assert text.returncode == 0 and row.split()[1:3] == ["healthy", str(w["pid"])], text.stdout
        assert f"grpc {ports.weights}" in row and f"1 (exits [{-signal.SIGKILL}])" in row, row

        pids = [s["pid"] for s in after["services"].values()] + [after["supervisor"]["pid"]]
    finally:
        down = apprentice("down", timeout=180)
    assert down.returncode == 0, down.stdout + down.stderr
    wait_for(lambda: not any(_alive(p) for p in pids), what="every service process gone after down", stall_s=30,
             every=0.5)
    assert not (home / "stack.json").exists() and not (home / "endpoints.json").exists()
    assert broker_answers(kafka_bootstrap)             # down leaves alone a broker it did not start
    final = apprentice("status", "--json")
    assert final.returncode == 1
    assert not any(s["healthy"] for s in json.loads(final.stdout)["services"].values())


def _openai_sdks_against_the_stack(home: Path, ports: Ports, topics: Topics, bootstrap: str, model: str) -> None:
    """The official OpenAI SDKs (Python; Node where it is installed) with only the base URL and the key
    changed (and the stack's development CA trusted): answers come back with log-probs and interaction ids,
    and those interactions are on the topic with the same behaviour log-probs."""
    import shutil

    from openai import DefaultHttpxClient, OpenAI

    from shared.contracts.events import decode
    from shared.proto.apprentice.v1 import events_pb2
    from tests.helpers.kafka import read_all

    secrets = home / "secrets"
    base_url, key = f"https://localhost:{ports.http}/v1", (secrets / "backend-default.token").read_text().strip()
    client = OpenAI(base_url=base_url, api_key=key, http_client=DefaultHttpxClient(verify=str(secrets / "ca.pem")))
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                          n=2, logprobs=True)
    ids = chat.model_extra["apprentice"]["interaction_ids"]  # type: ignore[index]
    assert chat.id == ids[0] and len(ids) == 2
    logprobs = {iid: [t.logprob for t in c.logprobs.content]  # type: ignore[union-attr]
                for iid, c in zip(ids, chat.choices, strict=True)}
    node_dir = REPO / "tests" / "node"
    node = shutil.which("node")
    if node is not None and (node_dir / "node_modules" / "openai" / "package.json").exists():
        env = {"PATH": str(Path(node).parent), "HOME": str(Path.home()), "BASE_URL": base_url, "API_KEY": key,
               "MODEL": model, "NODE_EXTRA_CA_CERTS": str(secrets / "ca.pem")}
        out = subprocess.run([node, "smoke.mjs"], cwd=node_dir, env=env, capture_output=True, text=True, timeout=180)
        assert out.returncode == 0, out.stderr[-2000:]
        res = json.loads(out.stdout.strip().splitlines()[-1])
        for iid, c in zip(res["apprentice"]["interaction_ids"], res["choices"], strict=True):
            logprobs[iid] = c["logprobs"]
    deadline, seen = time.monotonic() + 60, dict[str, events_pb2.Interaction]()
    while time.monotonic() < deadline and set(seen) < set(logprobs):
        for m in read_all(bootstrap, topics.interactions, idle=1.0, timeout=10):
            it = decode(events_pb2.Interaction, m.value())
            seen[it.interaction_id] = it
    assert set(logprobs) <= set(seen), "an SDK's answer is not on the interactions topic"
    for iid, lps in logprobs.items():
        assert seen[iid].envelope.tenant == "default" and seen[iid].policy_version == "base"
        assert list(seen[iid].response_logprobs) == pytest.approx(lps, abs=1e-5)
