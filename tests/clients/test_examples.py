"""The product-backend examples under examples/ run against the real inference server (keys, TLS, tiny model,
real broker): Python over gRPC (in the light client's own venv), Python with the OpenAI SDK, Node over gRPC
(@grpc/grpc-js + @grpc/proto-loader), Go with the generated stubs. Each answer is captured for the backend
key's tenant and its feedback lands on the feedback topic. The snippets of the README and
docs/integration.md are copied from these files (checked here too), so what the docs show is what ran.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.clients.conftest import REPO, TENANT, ClientVenv, GoStubs, Server, run
from tests.clients.test_doc_snippets import doc_paths

EXAMPLES = REPO / "examples"
pytestmark = pytest.mark.integration


def _check_reported(server: Server, stdout: str) -> None:
    """The example's last line: its interaction id and feedback event, both on their topics."""
    from shared.proto.apprentice.v1 import events_pb2
    from tests.helpers.kafka import collect

    out = json.loads(stdout.strip().splitlines()[-1])
    assert out["accepted"] is True and out["policy_version"] == "base", out
    iid = out["interaction_id"]
    got = [e for e in collect(server.bootstrap, server.topics.interactions, events_pb2.Interaction, want=[iid])
           if e.interaction_id == iid]
    assert got and got[0].envelope.tenant == TENANT and got[0].task == "support"
    assert got[0].session_id == server.app.privacy.sessions(TENANT, "user-42-chat-7") and got[0].response_logprobs
    fb = [e for e in collect(server.bootstrap, server.topics.feedback, events_pb2.FeedbackEvent,
                             want=[out["feedback_event_id"]], key=lambda m: m.envelope.event_id)
          if e.envelope.event_id == out["feedback_event_id"]]
    assert fb and fb[0].interaction_id == iid and fb[0].kind == "thumbs"


def _run_example(cmd: list[str], server: Server, cwd: Path, **extra: str) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env={**server.example_env(), **extra}, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_python_grpc_example_in_the_light_clients_venv(server: Server, client_venv: ClientVenv,
                                                       tmp_path: Path) -> None:
    out = _run_example([str(client_venv.python), str(EXAMPLES / "python" / "grpc_backend.py")], server, tmp_path)
    _check_reported(server, out)


def test_python_openai_sdk_example(server: Server, tmp_path: Path) -> None:
    pytest.importorskip("openai")
    out = _run_example([sys.executable, str(EXAMPLES / "python" / "openai_backend.py")], server, tmp_path)
    _check_reported(server, out)


def test_node_grpc_example(server: Server, tmp_path: Path) -> None:
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            pytest.skip(f"no Node toolchain (`{tool}`) on PATH")
    app = tmp_path / "node"
    shutil.copytree(EXAMPLES / "node", app, ignore=shutil.ignore_patterns("node_modules"))
    run(["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"], cwd=app)
    out = _run_example(["node", "grpc_backend.mjs"], server, app, APPRENTICE_PROTOS=str(REPO / "protos"))
    _check_reported(server, out)


def test_go_example_with_generated_stubs(server: Server, go_stubs: GoStubs) -> None:
    app = go_stubs.module.parent.parent / "examples" / "go"     # beside clients/go, as in the repository
    shutil.copytree(EXAMPLES / "go", app, dirs_exist_ok=True)
    run(["go", "mod", "tidy"], cwd=app, env=go_stubs.env)
    run(["go", "build", "-o", "backend", "."], cwd=app, env=go_stubs.env)
    out = _run_example([str(app / "backend")], server, app)
    _check_reported(server, out)


# --- the docs show these files --------------------------------------------------------------------
SNIPPET = re.compile(r"<!-- example: (?P<path>\S+) -->\s*```\w*\n(?P<code>.*?)```", re.S)


def test_doc_snippets_are_copied_from_the_examples() -> None:
    """The README shows the two Python clients, docs/integration.md the Node and Go ones; every snippet
    marked `<!-- example: PATH -->` in any document is a copy of its file."""
    shown: dict[str, set[str]] = {}
    for doc in doc_paths():
        for m in SNIPPET.finditer((REPO / doc).read_text()):
            shown.setdefault(doc, set()).add(m["path"])
            _check_copied(doc, m["path"], m["code"])
    assert {"examples/python/grpc_backend.py", "examples/python/openai_backend.py"} <= shown.get("README.md", set()), shown
    assert {"examples/node/grpc_backend.mjs", "examples/go/main.go"} <= shown.get("docs/integration.md", set()), shown


def _check_copied(doc: str, path: str, snippet: str) -> None:
    """Every line of the snippet appears in the file in the same order (the snippet may skip lines)."""
    source = (REPO / path).read_text()
    code = textwrap.dedent(snippet)
    assert code.strip(), f"{doc}: empty snippet of {path}"
    lines = [ln for ln in code.splitlines() if ln.strip() and not ln.strip().startswith(("...", "// ...", "# ..."))]
    pos = 0
    for ln in lines:
        found = source.find(ln, pos)
        assert found >= 0, f"{doc}: snippet line not in {path} (in order): {ln!r}"
        pos = found + len(ln)
