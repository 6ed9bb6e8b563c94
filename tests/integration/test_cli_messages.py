"""What the CLI says at its rough edges, as a user runs it (real processes, real servers, real brokers):

- a broker of another home answering at the configured port: `kafka status` names the data folder that broker
  really uses, and `up` refuses and says whose it is unless asked to share it;
- `weights list` with only the base model: one clear line, and JSON of the same shape as with versions;
- an empty `knowledge list`: "no knowledge bases yet" for an operator, distinct from a caller that sees nothing
  and from a real permission denial;
- the stack down: one line naming the service, its address and `apprentice up`, exit 3, no traceback;
- a reader that closes the pipe (`| head -1`): a quiet exit 141, no BrokenPipeError traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from services.weights.cli import list_json
from services.weights.service import RunningServer
from shared.proto.apprentice.v1 import weights_pb2, weights_pb2_grpc
from shared.settings import CommonSettings
from tests.helpers.kafka import private_broker
from tests.helpers.ports import free_port
from tests.helpers.weights import start_weights
from tools.broker.local_broker import LocalBroker
from tools.cli import main as cli_main
from tools.cli.failures import describe_unreachable

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
MODEL = "tiny-random"


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPRENTICE_")}
    env.update(APPRENTICE_HOME=str(home), PYTHONUNBUFFERED="1", **extra)
    return env


def _apprentice(home: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tools.cli.main", *args], cwd=REPO, env=_env(home, **extra),
                          capture_output=True, text=True, timeout=120)


def _no_traceback(proc: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr


# --- 1. whose broker answers ------------------------------------------------------------------------
@pytest.fixture
def other_homes_broker(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A second local broker, of another home ("another checkout"), on free ports: (that home, its
    bootstrap). The suite's broker on 9092 is never touched."""
    home = tmp_path / "checkout-a" / ".apprentice"
    broker = private_broker(home)
    broker.start()
    try:
        yield home, broker.bootstrap
    finally:
        broker.stop()


def test_a_second_homes_broker_gets_its_own_controller_port(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """`up`'s refusal suggests another port for this home's broker: its controller must move along (9093
    is the first broker's), while 9092's stays 9093."""
    monkeypatch.setenv("APPRENTICE_HOME", str(tmp_path))
    monkeypatch.setenv("APPRENTICE_KAFKA_BOOTSTRAP", "127.0.0.1:29092")
    assert LocalBroker.for_settings(CommonSettings()).controller_port == 29093
    monkeypatch.setenv("APPRENTICE_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    assert LocalBroker.for_settings(CommonSettings()).controller_port == 9093


def test_up_refuses_another_homes_broker_and_status_names_its_data(other_homes_broker: tuple[Path, str],
                                                                    tmp_path: Path) -> None:
    home_a, bootstrap = other_homes_broker
    data_a = (home_a / "kafka" / "data").resolve()
    home_b = tmp_path / "checkout-b" / ".apprentice"
    home_b.mkdir(parents=True)

    own = _apprentice(home_a, "kafka", "status", APPRENTICE_KAFKA_BOOTSTRAP=bootstrap)
    assert own.returncode == 0 and "started by apprentice" in own.stdout and f"data {data_a}" in own.stdout, own.stdout

    # from the other home: the data folder of the broker that answers, never this home's unused one
    st = _apprentice(home_b, "kafka", "status", APPRENTICE_KAFKA_BOOTSTRAP=bootstrap)
    assert st.returncode == 0, st.stdout + st.stderr
    assert "not this home's" in st.stdout and f"the broker of {home_a.resolve()}" in st.stdout, st.stdout
    assert f"data {data_a}" in st.stdout and f"data {home_b / 'kafka' / 'data'}" not in st.stdout, st.stdout

    # `up` refuses, says whose broker it is and how to share it, and starts nothing
    up = _apprentice(home_b, "up", "--wait", "5", APPRENTICE_KAFKA_BOOTSTRAP=bootstrap, APPRENTICE_MODEL=MODEL)
    assert up.returncode == 1, up.stdout + up.stderr
    assert str(home_a.resolve()) in up.stderr and str(data_a) in up.stderr and "--use-running-broker" in up.stderr
    _no_traceback(up)
    assert not (home_b / "stack.json").exists() and not (home_b / "logs" / "supervisor.log").exists()
    assert not (home_b / "kafka" / "data").exists()

    # asked to share it without that broker's credentials: `up` says which ones it needs (the broker
    # authorizes every client, SECURITY.md §4)
    admin_file = home_a.resolve() / "kafka" / "sasl" / "admin.password"  # not resolved: sasl/ may be a link
    refused = _apprentice(home_b, "up", "--use-running-broker", APPRENTICE_KAFKA_BOOTSTRAP=bootstrap,
                          APPRENTICE_MODEL=MODEL)
    assert refused.returncode == 1 and f"APPRENTICE_KAFKA_SASL_PASSWORD_FILE={admin_file}" in refused.stderr, \
        refused.stderr
    _no_traceback(refused)
    # with them (flag or variable): `up` goes on, and says whose broker it shares. A live supervisor
    # recorded in this home stands in for a running stack, so `up` stops right after the broker step.
    (home_b / "stack.json").write_text(json.dumps({"supervisor_pid": os.getpid()}))
    admin = {"APPRENTICE_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "APPRENTICE_KAFKA_SASL_MECHANISM": "PLAIN",
             "APPRENTICE_KAFKA_SASL_USERNAME": "admin", "APPRENTICE_KAFKA_SASL_PASSWORD_FILE": str(admin_file)}
    for args, extra in ((["--use-running-broker"], admin), ([], {"APPRENTICE_USE_RUNNING_BROKER": "1", **admin})):
        shared = _apprentice(home_b, "up", *args, APPRENTICE_KAFKA_BOOTSTRAP=bootstrap, APPRENTICE_MODEL=MODEL,
                             **extra)
        assert shared.returncode == 0, shared.stdout + shared.stderr
        assert f"kafka broker shared at {bootstrap}" in shared.stdout and \
            f"not this home's: the broker of {home_a.resolve()}" in shared.stdout and \
            "the stack is already up" in shared.stdout, shared.stdout


# --- 2. weights list with only the base model -------------------------------------------------------
@pytest.fixture
def weights_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningServer]:
    monkeypatch.setenv("APPRENTICE_TOPIC_PREFIX", f"test-{uuid.uuid4().hex[:8]}.")  # no Kafka traffic here
    running = start_weights(tmp_path / "store")
    yield running
    running.stop(grace=1.0)


def test_weights_list_with_only_the_base_model(weights_server: RunningServer, tmp_path: Path) -> None:
    endpoint = f"127.0.0.1:{weights_server.port}"
    text = _apprentice(tmp_path, "weights", "list", "--endpoint", endpoint, "--model", MODEL)
    assert text.returncode == 0, text.stderr
    assert text.stdout == f"only the base model {MODEL}; no trained versions yet (serving: base for every tenant)\n"
    as_json = _apprentice(tmp_path, "weights", "list", "--json", "--endpoint", endpoint, "--model", MODEL)
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout) == {"model": MODEL, "serving": {"": "base"},
                                          "versions": [{"model": MODEL, "version": "base", "kind": "base"}]}


def test_weights_list_json_has_one_shape() -> None:
    """With trained versions: the same keys, the base model first, then the stored versions as before."""
    resp = weights_pb2.ListVersionsResponse(versions=[weights_pb2.Manifest(model=MODEL, version="v1", kind="lora")])
    out = list_json(MODEL, resp, {"": "v1", "acme": "base"})
    assert out == {"model": MODEL, "serving": {"": "v1", "acme": "base"},
                   "versions": [{"model": MODEL, "version": "base", "kind": "base"},
                                {"model": MODEL, "version": "v1", "kind": "lora"}]}


# --- 3. an empty knowledge list ----------------------------------------------------------------------
@pytest.fixture
def knowledge_with_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, str]]:
    """The real Knowledge service over an empty store, with the stack's development keys and TLS:
    (the home holding them, its endpoint)."""
    from services.extractor.servicer import create_knowledge_server
    from shared.settings import CommonSettings
    from tests.unit.extractor.test_review import make_store
    from tools.devca import ensure_dev_credentials

    home = tmp_path / "home"
    creds = ensure_dev_credentials(home, ("acme",))
    for k, v in creds.service_env().items():
        monkeypatch.setenv(k, v)
    store, _ = make_store()
    server, port, _ = create_knowledge_server(store, 0, host="127.0.0.1", common=CommonSettings())
    server.start()
    yield home, f"localhost:{port}"
    server.stop(0)


def test_empty_knowledge_list_says_none_yet(knowledge_with_keys: tuple[Path, str]) -> None:
    home, endpoint = knowledge_with_keys
    secrets = home / "secrets"
    # the operator (the CLI's key under `apprentice up`): nothing learnt yet, and what creates a base
    op = _apprentice(home, "knowledge", "--endpoint", endpoint, "list")
    assert op.returncode == 0, op.stderr
    assert op.stdout.startswith("no knowledge bases yet: the extractor creates one per TENANT/DOMAIN"), op.stdout
    assert "visible" not in op.stdout and "operator" not in op.stdout
    shown = _apprentice(home, "knowledge", "--endpoint", endpoint, "show")
    assert shown.returncode == 0 and shown.stdout.startswith("no knowledge bases yet:"), shown.stdout
    # a backend key: its own tenant, nothing yet
    acme = _apprentice(home, "knowledge", "--endpoint", endpoint, "list",
                       APPRENTICE_AUTH_TOKEN_FILE=str(secrets / "backend-acme.token"))
    assert acme.returncode == 0 and acme.stdout.startswith("no knowledge bases yet:"), acme.stdout + acme.stderr
    # a service key lists nothing without a tenant: said as such, not as "none exist"
    svc = _apprentice(home, "knowledge", "--endpoint", endpoint, "list",
                      APPRENTICE_AUTH_TOKEN_FILE=str(secrets / "service.token"))
    assert svc.returncode == 0 and svc.stdout.startswith("no knowledge bases visible without a tenant"), svc.stdout
    # a real refusal is the server's PERMISSION_DENIED, with its reason
    denied = _apprentice(home, "knowledge", "--endpoint", endpoint, "list", "--tenant", "globex",
                         APPRENTICE_AUTH_TOKEN_FILE=str(secrets / "backend-acme.token"))
    assert denied.returncode == 1 and "PERMISSION_DENIED" in denied.stderr and not denied.stdout, denied.stderr


# --- 4. the stack down ----------------------------------------------------------------------------
def _closed_port() -> str:
    return f"127.0.0.1:{free_port()}"


def test_stack_down_is_one_line_per_command(tmp_path: Path) -> None:
    weights, extractor, broker = _closed_port(), _closed_port(), _closed_port()
    env = {"APPRENTICE_WEIGHTS_ENDPOINT": weights, "APPRENTICE_EXTRACTOR_ENDPOINT": extractor,
           "APPRENTICE_KAFKA_BOOTSTRAP": broker}
    cases = [(["weights", "list"], f"the weights service at {weights} is not answering", "APPRENTICE_WEIGHTS_ENDPOINT"),
             (["weights", "status"], f"the weights service at {weights} is not answering", "APPRENTICE_WEIGHTS_ENDPOINT"),
             (["knowledge", "approve", "acme/support", "item-1"], f"the extractor service at {extractor} is not "
              "answering", "APPRENTICE_EXTRACTOR_ENDPOINT"),
             (["knowledge", "list"], f"neither the extractor service at {extractor} nor the Kafka broker at "
              f"{broker}", "APPRENTICE_EXTRACTOR_ENDPOINT"),
             (["topics"], f"the Kafka broker at {broker} is not answering", "APPRENTICE_KAFKA_BOOTSTRAP")]
    for args, says, var in cases:
        proc = _apprentice(tmp_path, *args, **env)
        lines = proc.stderr.splitlines()
        assert proc.returncode == 3 and len(lines) == 1, (args, proc.stderr)
        assert lines[0].startswith(f"apprentice {args[0]}") and says in lines[0], (args, lines)
        assert "start the local stack with `apprentice up`" in lines[0] and var in lines[0], (args, lines)
        _no_traceback(proc)


def _raise_unreachable(argv: list[str]) -> int:
    """A command that lets a real call to a closed port escape (what the entry point must word)."""
    with grpc.insecure_channel(argv[0]) as ch:
        weights_pb2_grpc.WeightsStub(ch).List(weights_pb2.ListVersionsRequest(model=MODEL), timeout=10)
    return 0


def test_entry_point_words_any_unreachable_service(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A command that does not catch UNAVAILABLE itself still ends in one line and exit 3; a server's own
    UNAVAILABLE (it answered) and other errors are not worded as "not answering"."""
    address = _closed_port()
    monkeypatch.setitem(cli_main.DELEGATED, "weights", cli_main.Command(_raise_unreachable, ""))
    monkeypatch.setenv("APPRENTICE_HOME", str(Path(os.environ.get("TMPDIR", "/tmp")) / f"none-{uuid.uuid4().hex}"))
    assert cli_main.main(["weights", address]) == 3
    err = capsys.readouterr().err
    assert err == (f"apprentice weights: the weights service at {address} is not answering (connection refused); "
                   "start the local stack with `apprentice up` (or set APPRENTICE_WEIGHTS_ENDPOINT to where it runs)\n")

    class ServerSaid(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.UNAVAILABLE

        def details(self) -> str:
            return "the store is busy; retry"

    assert describe_unreachable(ServerSaid(), "weights") is None
    assert describe_unreachable(ValueError("x"), "weights") is None


# --- 5. a reader that closes the pipe ------------------------------------------------------------------
def test_closed_pipe_ends_quietly(weights_server: RunningServer, tmp_path: Path) -> None:
    endpoint = f"127.0.0.1:{weights_server.port}"
    for args in (["weights", "status", "--endpoint", endpoint], ["weights", "list", "--endpoint", endpoint],
                 ["weights", "--help"]):
        for unbuffered in ("1", ""):  # writes fail at each print, or at the final flush (a pipe's usual buffering)
            env = {**_env(tmp_path), "PYTHONUNBUFFERED": unbuffered}
            proc = subprocess.Popen([sys.executable, "-m", "tools.cli.main", *args], cwd=REPO, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            assert proc.stdout is not None
            proc.stdout.close()          # `| head -0`: the reader is gone before the command writes a byte
            _, err = proc.communicate(timeout=60)
            # argparse drops its own help text silently when the pipe is gone (exit 0); everything else: 141
            assert proc.returncode == (0 if "--help" in args and unbuffered else 141), (args, proc.returncode, err)
            assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err, \
                (args, err)
