"""`apprentice up | down | status`: the local stack (broker + five services) as supervised processes."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc

from shared.contracts.grader_waiting import from_metrics
from shared.contracts.metric_names import INFERENCE_SPOOL_DEPTH
from shared.contracts.stack_endpoints import state_home
from shared.contracts.topic_access import OPERATOR
from shared.kafka.admin import broker_answers
from shared.kafka.lag import lag_by_group, partition_lag
from shared.metrics import metric_sum
from shared.models import ModelUnavailable, check_model_name
from shared.progress import progress, progress_enabled
from shared.proto.apprentice.v1 import knowledge_pb2, knowledge_pb2_grpc, weights_pb2, weights_pb2_grpc
from shared.security.channels import open_channel
from shared.settings import CommonSettings
from tools.broker.cli import SHARE_ENV, foreign_broker, kafka, share_broker, whose
from tools.broker.local_broker import LocalBroker, apply_client_env, local_credentials_dir
from tools.devca import apply_stack_client_env, ensure_dev_credentials
from tools.stack.client_env import env_lines, kafka_lines
from tools.stack.ports import Ports
from tools.stack.probe import metrics_text, service_health, stack_ports, stack_state
from tools.stack.status_view import render_status
from tools.stack.supervisor import main as supervise
from tools.tasks.config import MERGED_ENVS, write_task_config
from tools.tasks.task import TaskError, load_task


def _supervisor_pid(home: Path) -> int | None:
    try:
        pid = int(stack_state(home)["supervisor_pid"])
        os.kill(pid, 0)
        return pid
    except (ValueError, KeyError, ProcessLookupError):
        return None


def _apply_task(name_or_path: str, home: Path) -> str | None:
    """Write the task's per-service config under `<home>/config/` and put its settings into this process's
    environment, which the supervisor and the services inherit (a variable the user set wins; business
    names and data are merged: the user's mappings plus the task's). Returns
    the task's tenant, or None after printing why the task is refused."""

    try:
        task = load_task(name_or_path)
        per_service = write_task_config(task, home / "config")
    except TaskError as e:
        print(f"apprentice up: {e}", file=sys.stderr)
        return None
    for env in per_service.values():
        for key, value in env.items():
            if key in MERGED_ENVS:
                os.environ[key] = value     # already the user's own mapping with the task's added
            else:
                os.environ.setdefault(key, value)
    print(f"task {task.name}: tenant {task.tenant!r}, task {task.task!r}, KPI {task.kpi.name!r} "
          f"(service config in {home / 'config'})")
    return task.tenant


def up(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="apprentice up",
                                 description="Start the broker, the five services and the dashboard.")
    ap.add_argument("--foreground", action="store_true", help="supervise in this terminal (Ctrl-C stops all)")
    ap.add_argument("--wait", type=float, default=300.0, help="seconds to wait for every service to be healthy")
    ap.add_argument("--task", default=None, help="a task file or shipped task name: its tenant, task and KPI "
                    "configure the grader, the gate's eval sets and the trainer (tools/demo/README.md)")
    ap.add_argument("--use-running-broker", action="store_true",
                    help="share the broker that answers at the Kafka address even when it is another home's "
                         "(another checkout's); without it `up` refuses and names whose it is "
                         "(also APPRENTICE_USE_RUNNING_BROKER=1)")
    ns = ap.parse_args(argv)
    settings = CommonSettings()

    try:  # before anything starts: every service would fail on it, restarted again and again
        check_model_name(settings.model)
    except ModelUnavailable as e:
        print(f"apprentice up: {e}", file=sys.stderr)
        return 2
    sharing = ns.use_running_broker or os.environ.get(SHARE_ENV, "") not in ("", "0")
    if not sharing:
        refusal = foreign_broker(settings)  # another home's broker: its data is not where ours would be
        if refusal is not None:
            print(f"apprentice up: {refusal}", file=sys.stderr)
            return 1
    held = local_credentials_dir(os.environ)
    if sharing and held is None and (st := LocalBroker.for_settings(settings).status()).refuses_admin:
        home = st.serving_home or Path("<its home>")
        print(f"apprentice up: to share {whose(st)}, run as its admin: APPRENTICE_KAFKA_SECURITY_PROTOCOL="
              f"SASL_PLAINTEXT APPRENTICE_KAFKA_SASL_MECHANISM=PLAIN APPRENTICE_KAFKA_SASL_USERNAME=admin "
              f"APPRENTICE_KAFKA_SASL_PASSWORD_FILE={home / 'kafka' / 'sasl' / 'admin.password'}", file=sys.stderr)
        return 1
    if sharing and held is not None and held.resolve() != (settings.home / "kafka" / "sasl").resolve():
        # another home's local broker, whose admin credentials the environment holds: its users exist;
        # this deployment gets its topics and ACLs there
        if share_broker(settings, held) != 0:
            return 1
    elif kafka(["start"]) != 0:
        return 1
    # this process (status, lag) as the operator; the supervisor gives each service its own principal
    if apply_client_env(settings.home, OPERATOR):
        settings = CommonSettings()
    if _supervisor_pid(settings.home):
        print("the stack is already up (apprentice status)")
        return 0
    tenants: tuple[str, ...] = ("demo", "default")
    if ns.task:
        task_tenant = _apply_task(ns.task, settings.home)
        if task_tenant is None:
            return 2
        tenants = (*tenants, task_tenant)
    if not (os.environ.get("APPRENTICE_AUTH_KEYS") or os.environ.get("APPRENTICE_AUTH_KEYS_FILE")):
        creds = ensure_dev_credentials(settings.home, tenants)
        apply_stack_client_env(settings.home)
        print(f"authentication and TLS on: development CA and keys in {creds.directory} "
              f"(operator key: {creds.operator_token})")
    if ns.foreground:
        return supervise()
    log = settings.home / "logs" / "supervisor.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        sup = subprocess.Popen([sys.executable, "-m", "tools.stack.supervisor"], stdout=out,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    ports = Ports.configured()
    _wait_for_services(settings.home, ports, sup, ns.wait)
    if sup.poll() is not None:
        print(f"the supervisor exited with status {sup.returncode}; see {log}", file=sys.stderr)
        return 1
    report = collect_status(settings)
    print_status(report)
    secrets = settings.home / "secrets"
    if (secrets / "ca.pem").exists():
        print(f"\nCall it:  grpcurl -cacert {secrets / 'ca.pem'} -H \"authorization: Bearer $(cat "
              f"{secrets / 'backend-default.token'})\" -d '{{\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}]}}' "
              f"localhost:{ports.inference} apprentice.v1.Inference/Generate")
        if ports.http:
            print(f"      or:  curl --cacert {secrets / 'ca.pem'} -H \"authorization: Bearer $(cat "
                  f"{secrets / 'backend-default.token'})\" https://localhost:{ports.http}/v1/chat/completions "
                  "-d '{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}'   (any OpenAI SDK: "
                  f"base_url https://localhost:{ports.http}/v1)")
    else:
        print("\nCall it:  grpcurl -plaintext -d '{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}' "
              f"localhost:{ports.inference} apprentice.v1.Inference/Generate")
        if ports.http:
            print(f"      or:  curl http://localhost:{ports.http}/v1/chat/completions "
                  "-d '{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}'")
    if (secrets / "ca.pem").exists():
        _print_client_env(settings.home)
    analytics = kafka_lines(settings.home, settings.kafka_bootstrap)
    if analytics:
        print("\nKafka consumers outside the loop (read-only) log in as 'analytics' "
              "(or: eval \"$(apprentice env --kafka analytics)\"):")
        print("\n".join(line for line in analytics if not line.startswith("#")))
    if ports.dashboard:
        secure = (secrets / "ca.pem").exists()
        print(f"Dashboard: {'https' if secure else 'http'}://localhost:{ports.dashboard}/"
              + (f"  (sign in with the operator key in {secrets / 'operator.token'})" if secure else ""))
    return 0 if all(service_health(ports).values()) else 1


def _print_client_env(home: Path) -> None:
    """The lines of `apprentice env`: stock clients (OpenAI SDKs, curl, Node, Go) fail with a bare
    "Connection error." until told the stack's CA, so `up` shows how, right where it shows the URLs."""

    try:
        lines = env_lines(home)
    except FileNotFoundError:
        return
    print("\nStock clients (OpenAI SDKs, curl, Node, Go) trust and reach the stack with these lines "
          "(or: eval \"$(apprentice env)\"):")
    print("\n".join(line for line in lines if not line.startswith("#")))


def _wait_for_services(home: Path, ports: Ports, sup: subprocess.Popen[bytes], wait_s: float) -> dict[str, bool]:
    """Wait until every service is healthy (or `wait_s`, or the supervisor died), showing which ones are
    still starting: a bar on a terminal, else one line on stderr whenever the set changes (at most every
    30 s while it does not)."""

    t0 = time.monotonic()
    deadline = t0 + wait_s
    health = service_health(ports)
    bar = progress(total=len(health), desc="apprentice up", unit="service",
                   bar_format="{desc}: {n}/{total} healthy [{elapsed}]{postfix}")
    last_line, last_at = "", 0.0
    with bar:
        while True:
            health = service_health(ports)
            starting = [n for n, ok in health.items() if not ok]
            exits = {n: s.get("exits") for n, s in stack_state(home).get("services", {}).items() if s.get("exits")}
            note = ("still starting: " + ", ".join(f"{n} (exited {len(exits[n])}x)" if n in exits else n
                                                  for n in starting)) if starting else "all healthy"
            bar.n = len(health) - len(starting)
            bar.set_postfix_str(note)
            now = time.monotonic()
            if not progress_enabled() and (note != last_line or now - last_at >= 30):
                print(f"apprentice up: {len(health) - len(starting)}/{len(health)} healthy after "
                      f"{now - t0:.0f}s; {note}", file=sys.stderr, flush=True)
                last_line, last_at = note, now
            if not starting or now >= deadline or sup.poll() is not None:
                return health
            time.sleep(2)


def down(argv: list[str]) -> int:
    argparse.ArgumentParser(prog="apprentice down", description="Stop the local stack.").parse_args(argv)
    settings = CommonSettings()
    pid = _supervisor_pid(settings.home)
    if pid:
        os.kill(pid, signal.SIGTERM)
        for _ in range(120):
            try:
                os.kill(pid, 0)
                time.sleep(0.5)
            except ProcessLookupError:
                break
        print("services stopped")

    return kafka(["stop"])


def service_ports(ports: Ports) -> dict[str, dict[str, int]]:
    """What each service listens on (status's PORT column): gRPC and HTTP where it has them, else metrics."""
    return {"inference": {"grpc": ports.inference, "http": ports.http},
            "grader": {"metrics": ports.metrics["grader"]},
            "extractor": {"grpc": ports.extractor},
            "trainer": {"metrics": ports.metrics["trainer"]},
            "weights": {"grpc": ports.weights}}


def collect_status(settings: CommonSettings) -> dict[str, Any]:
    report: dict[str, Any] = {"broker": {"bootstrap": settings.kafka_bootstrap,
                                         "up": broker_answers(settings.kafka_bootstrap)}}
    home = state_home(settings.home)    # a private stack (the demo's) announced here keeps its state in its run
    state = stack_state(home)
    ports = stack_ports(home)
    health = service_health(ports)
    report["supervisor"] = {"pid": _supervisor_pid(home), "ports": ports.as_dict(), "home": str(home)}
    report["services"] = {name: {"healthy": ok, **state.get("services", {}).get(name, {}),
                                 "ports": service_ports(ports)[name]}
                          for name, ok in health.items()}
    report["spool_depth"] = metric_sum(metrics_text(ports.metrics["inference"]), INFERENCE_SPOOL_DEPTH)
    waiting = from_metrics(metrics_text(ports.metrics["grader"]))  # answers waiting for feedback (contracts/grader_waiting.py)
    report["grader_waiting"] = waiting.as_dict() if waiting is not None else None
    report["pods"], report["knowledge"] = _versions(settings, ports)
    if report["broker"]["up"]:
        try:
            report["lag"] = lag_by_group(partition_lag(settings.kafka_bootstrap, settings.topics,
                                                       security=settings))
        except Exception as e:  # noqa: BLE001 - status must print whatever it can
            report["lag"] = {"error": str(e)}
    return report


def _versions(settings: CommonSettings, ports: Ports) -> tuple[Any, Any]:
    pods: Any = None
    knowledge: Any = None
    try:
        with open_channel(f"127.0.0.1:{ports.weights}") as ch:
            st = weights_pb2_grpc.WeightsStub(ch).Status(weights_pb2.StatusRequest(model=settings.model), timeout=3)
            pods = {"promoted": st.promoted_version, "canary": st.canary_version, "converged": st.converged,
                    "pods": {p.pod_id: {"serving": p.serving_version, "tenants": dict(p.tenant_versions),
                                        "lagging": p.lagging} for p in st.pods}}
    except grpc.RpcError as e:
        pods = {"error": e.code().name}
    try:
        with open_channel(f"127.0.0.1:{ports.extractor}") as ch:
            lst = knowledge_pb2_grpc.KnowledgeStub(ch).List(knowledge_pb2.ListKnowledgeRequest(), timeout=3)
            knowledge = {b.key: {"version": b.version, "items": b.item_count} for b in lst.bases}
    except grpc.RpcError as e:
        knowledge = {"error": e.code().name}
    return pods, knowledge


def print_status(report: dict[str, Any]) -> None:
    print(render_status(report))


def status(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="apprentice status", description="Health, versions, lag, spool, knowledge.")
    ap.add_argument("--json", action="store_true")
    ns = ap.parse_args(argv)
    report = collect_status(CommonSettings())
    if ns.json:
        print(json.dumps(report, indent=1, default=str))
    else:
        print_status(report)
    return 0 if report["broker"]["up"] and all(s["healthy"] for s in report["services"].values()) else 1
