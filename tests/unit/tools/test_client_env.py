"""`apprentice env`: the lines evaluate in a POSIX shell to absolute paths and the stack's address and key;
the replacing variables name a bundle that keeps the system's CAs (public HTTPS still works) and adds the
stack's; a home without credentials is one line saying how to get them; `up` prints the same lines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shared.contracts.stack_endpoints import StackEndpoints, write_endpoints
from tools.devca import ensure_dev_credentials
from tools.stack.client_env import REPLACING_VARS, env_lines, system_ca_file

REPO = Path(__file__).resolve().parents[3]


def _evaluated(lines: list[str], cwd: Path) -> dict[str, str]:
    names = [*REPLACING_VARS, "NODE_EXTRA_CA_CERTS", "OPENAI_BASE_URL", "OPENAI_API_KEY", "APPRENTICE_TARGET",
             "APPRENTICE_BASE_URL", "APPRENTICE_CA", "APPRENTICE_API_KEY"]
    script = "\n".join(lines) + "\n" + "\n".join(f'printf "%s=%s\\n" {n} "${n}"' for n in names)
    out = subprocess.run(["sh", "-c", script], cwd=cwd, capture_output=True, text=True, check=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines())


def test_lines_name_the_recorded_stack_with_absolute_paths(tmp_path: Path) -> None:
    home = tmp_path / "home with space"
    creds = ensure_dev_credentials(home)
    write_endpoints(home, StackEndpoints(supervisor_pid=os.getpid(), kafka_bootstrap="127.0.0.1:9092",
                                         grpc={"inference": "127.0.0.1:61051"}, http={"openai": 61800},
                                         tls_ca=str(creds.ca)))
    env = _evaluated(env_lines(home), tmp_path / "..")      # from another folder: paths are absolute
    bundle = creds.directory / "ca-bundle.pem"
    assert {env[v] for v in REPLACING_VARS} == {str(bundle)}
    assert env["NODE_EXTRA_CA_CERTS"] == env["APPRENTICE_CA"] == str(creds.ca)
    assert env["OPENAI_BASE_URL"] == env["APPRENTICE_BASE_URL"] == "https://127.0.0.1:61800/v1"
    assert env["APPRENTICE_TARGET"] == "127.0.0.1:61051"
    assert env["OPENAI_API_KEY"] == env["APPRENTICE_API_KEY"] == creds.token(creds.backend_token("default"))
    text = bundle.read_text()
    assert text.endswith(creds.ca.read_text())
    system = system_ca_file()
    if system is not None:
        assert text.startswith(system.read_text()[:200])     # the system's CAs stay trusted


def test_lines_for_another_tenant_and_without_a_running_stack(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APPRENTICE_INFERENCE_HTTP_PORT", "18000")
    creds = ensure_dev_credentials(tmp_path, tenants=("shop",))
    env = _evaluated(env_lines(tmp_path, "shop"), tmp_path)
    assert env["OPENAI_BASE_URL"] == "https://127.0.0.1:18000/v1"       # the configured port
    assert env["OPENAI_API_KEY"] == creds.token(creds.backend_token("shop"))
    with pytest.raises(FileNotFoundError):
        env_lines(tmp_path, "nobody")


def test_command_without_credentials_is_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPRENTICE_")}
    proc = subprocess.run([sys.executable, "-m", "tools.cli.main", "env"], cwd=tmp_path, capture_output=True,
                          text=True, env={**env, "PYTHONPATH": str(REPO)}, timeout=60)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "apprentice up" in proc.stderr, proc.stderr


def test_command_output_evaluates(tmp_path: Path) -> None:
    """`eval "$(apprentice env)"` as the README shows it."""
    ensure_dev_credentials(tmp_path / ".apprentice")
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPRENTICE_")}
    script = (f'eval "$({sys.executable} -m tools.cli.main env)"\n'
              'test -s "$SSL_CERT_FILE" && test -s "$NODE_EXTRA_CA_CERTS" && test -n "$OPENAI_API_KEY"\n'
              'echo "$OPENAI_BASE_URL"')
    proc = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          env={**env, "PYTHONPATH": str(REPO)}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().startswith("https://127.0.0.1:") and proc.stdout.strip().endswith("/v1")


def test_up_prints_the_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tools.stack.cli import _print_client_env

    ensure_dev_credentials(tmp_path)
    _print_client_env(tmp_path)
    out = capsys.readouterr().out
    assert 'eval "$(apprentice env)"' in out
    assert f"export SSL_CERT_FILE={tmp_path / 'secrets' / 'ca-bundle.pem'}" in out
    assert "export OPENAI_API_KEY=" in out and "NODE_EXTRA_CA_CERTS" in out


def test_kafka_lines_log_in_as_analytics_without_printing_the_password(tmp_path: Path) -> None:
    from tools.stack.client_env import kafka_lines

    assert kafka_lines(tmp_path, "127.0.0.1:9092") == []           # no broker credentials yet
    sasl = tmp_path / "kafka" / "sasl"
    sasl.mkdir(parents=True)
    (sasl / "analytics.password").write_text("s3cret-analytics\n")
    text = "\n".join(kafka_lines(tmp_path, "127.0.0.1:9092"))
    assert "export APPRENTICE_KAFKA_SASL_USERNAME=analytics" in text
    assert f"export APPRENTICE_KAFKA_SASL_PASSWORD_FILE={(sasl / 'analytics.password').resolve()}" in text
    assert "APPRENTICE_KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT" in text and "s3cret" not in text
