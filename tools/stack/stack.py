"""A private local stack for one demo, end-to-end or chaos run: broker (shared, reused, or a private one)
+ the five services as supervised processes, in their own topic namespace, state folder and free ports.

Replicated (`replicas`, `trainer_ranks`): several inference pods, grader workers and weights replicas,
each a supervised child `SERVICE-N` on its own ports, and the trainer as torchrun ranks. Callers dial a
replicated service through one address list (`replica_target`), which moves to the next replica when
one goes. Weights replicas share one store folder (its lock serialises every order); grader workers share
the Kafka group; the extractor stays one (docs/cluster.md says why).

Where the services listen and how they are wired to each other: ports.py (shared with `apprentice up`).
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shared.contracts.stack_endpoints import announce_endpoints, remove_endpoints, write_endpoints
from shared.contracts.topic_access import ADMIN
from shared.contracts.topics import Topics
from shared.kafka.admin import admin, ensure_topics
from shared.security.channels import open_channel, replica_target
from shared.settings import CommonSettings
from tools.broker.acls import apply_acls, grants
from tools.broker.cluster import LocalCluster, home_broker
from tools.broker.local_broker import (
    LocalBroker,
    apply_client_env,
    local_credentials_dir,
    principal_env,
    principal_security,
)
from tools.devca import ensure_dev_credentials
from tools.record_keys import ensure as ensure_record_keys
from tools.record_keys import records_dir
from tools.stack.ports import Ports, wire_services
from tools.stack.probe import grpc_healthy, metrics_text, service_health
from tools.stack.supervisor import SERVICES, Supervisor, service_of, stack_endpoints

if TYPE_CHECKING:
    pass

REPLICABLE = ("inference", "grader", "weights")
"""Services a local stack runs several of: the extractor is one writer of versioned knowledge, the trainer
scales by ranks, the dashboard is a view."""


def replica_env(child: str, ports: Ports, run_dir: Path) -> dict[str, str]:
    """What a replica `SERVICE-N` binds of its own (the rest of its environment is its service's)."""
    service, n = service_of(child), child.rsplit("-", 1)[1]
    metrics = {f"APPRENTICE_{service.upper()}_METRICS_PORT": str(ports.metrics[service])}
    if service == "inference":
        return {"APPRENTICE_INFERENCE_PORT": str(ports.inference), "APPRENTICE_INFERENCE_HTTP_PORT": str(ports.http),
                "APPRENTICE_INFERENCE_POD_ID": f"pod-{n}", **metrics}
    if service == "weights":
        return {"APPRENTICE_WEIGHTS_PORT": str(ports.weights), **metrics}
    if service == "grader":       # a worker's own faust data folder (its tables restore from the changelogs)
        return {"APPRENTICE_GRADER_WORKDIR": str(run_dir / child), **metrics}
    raise ValueError(f"{service} does not run as replicas here; replicated: {', '.join(REPLICABLE)}")


class LocalStack:
    def __init__(self, run_dir: Path, model: str, *, prefix: str | None = None,
                 service_env: dict[str, dict[str, str]] | None = None,
                 broker: LocalBroker | LocalCluster | None = None,
                 tenants: tuple[str, ...] = ("demo", "default"), secure: bool = True,
                 announce_in: Path | None = None, replicas: dict[str, int] | None = None,
                 trainer_ranks: int = 1, services: tuple[str, ...] = SERVICES) -> None:
        """`broker`: a private broker this stack starts (chaos runs stop and restart it); None = the
        configured bootstrap, started locally if nothing answers there (reused otherwise).
        `announce_in`: also record this stack's endpoints in that home (the default one, for the demo) while
        no other stack is recorded there, so the CLI finds it there without a variable.
        `secure`: authentication and TLS on, with development credentials under `<run_dir>/secrets/`
        (an operator key for this process, a service key for the services, a backend key per tenant).
        `replicas`: service -> how many (of REPLICABLE); `trainer_ranks`: torchrun processes of the trainer;
        `services`: which of the services run (all by default).
        `prefix`: the stack's topic namespace; None = a fresh one per run, `run-<id>.`, inside the namespace
        the environment configures (APPRENTICE_TOPIC_PREFIX=staging. -> `staging.run-<id>.`): the ACLs it
        applies and the topics it creates are that namespace's alone (shared/kafka/grants.py)."""
        self.run_dir = run_dir
        self.model = model
        self.announce_in = announce_in
        self._announced = False
        self.common = CommonSettings()
        self.broker = broker
        self.bootstrap = broker.bootstrap if broker is not None else self.common.kafka_bootstrap
        # Kafka credentials (SECURITY.md §4): each service is its own principal of the access table, with
        # the local broker's credentials: a private broker's, those this process already holds (tests:
        # the session broker's admin; the CLI), or those of the broker `start` starts. A broker with
        # credentials of the user's own (no local credentials folder) is left as the user configured it.
        self._starts: LocalBroker | LocalCluster | None = None
        if broker is not None:
            self.sasl_dir: Path | None = broker.sasl_dir
        elif (held := local_credentials_dir(os.environ)) is not None:
            self.sasl_dir = held
            local = home_broker(self.common)
            if local.sasl_dir.resolve() == held.resolve():
                self._starts = local                    # this home's broker: started here when it is down
        elif self.common.kafka_security_protocol == "PLAINTEXT":
            self._starts = home_broker(self.common)
            self.sasl_dir = self._starts.sasl_dir
        else:
            self.sasl_dir = None
        self.topics = Topics(prefix if prefix is not None
                             else f"{self.common.topic_prefix}run-{uuid.uuid4().hex[:8]}.")
        self.ports = Ports()
        unknown = set(replicas or {}) - set(REPLICABLE)
        if unknown:
            raise ValueError(f"no replicas of {sorted(unknown)} here; replicated: {', '.join(REPLICABLE)}")
        self.replica_ports = {f"{name}-{i}": Ports() for name, n in (replicas or {}).items() for i in range(1, n)}
        env = dict(os.environ, APPRENTICE_MODEL=model, APPRENTICE_TOPIC_PREFIX=self.topics.prefix,
                   APPRENTICE_HOME=str(run_dir), APPRENTICE_KAFKA_BOOTSTRAP=self.bootstrap,
                   PYTHONUNBUFFERED="1")
        self.creds = ensure_dev_credentials(run_dir, tenants) if secure else None
        if self.creds is not None:
            env.update(self.creds.service_env())
        per_service = wire_services(self.ports, inference_target=self.inference_target,
                                    weights_target=self.weights_target)
        per_service["inference"]["APPRENTICE_INFERENCE_POD_ID"] = "pod-0"
        if self.creds is not None:  # the dashboard reads every tenant's data and acts as the operator
            per_service["dashboard"]["APPRENTICE_DASHBOARD_OPERATOR_TOKEN_FILE"] = str(self.creds.operator_token)
        if self.sasl_dir is not None:
            for name in SERVICES:
                per_service[name].update(principal_env(self.sasl_dir, name))
        elif "APPRENTICE_RECORD_KEYS_DIR" not in env and self.common.record_signatures == "required":
            # a broker of the user's own: the services sign with keys under this run's home
            ensure_record_keys(records_dir(run_dir))
        for name, extra in (service_env or {}).items():
            per_service[name].update(extra)
        for child, ports in self.replica_ports.items():
            per_service[child] = {**per_service[service_of(child)], **replica_env(child, ports, run_dir)}
        unknown = set(services) - set(SERVICES)
        if unknown:
            raise ValueError(f"no service {sorted(unknown)}; services: {', '.join(SERVICES)}")
        self.services = tuple(name for name in SERVICES if name in services)
        children = tuple(c for name in self.services
                         for c in (name, *(r for r in self.replica_ports if service_of(r) == name)))
        self.supervisor = Supervisor(run_dir, children, env=env, service_env=per_service,
                                     ranks={"trainer": trainer_ranks})

    @property
    def client_common(self) -> CommonSettings:
        """Settings of this process as a client of the stack: verify its CA, present the operator key."""
        if self.creds is None:
            return self.common
        return self.common.model_copy(update={"tls_ca": self.creds.ca, "auth_token_file": self.creds.operator_token})

    def backend_token(self, tenant: str) -> str | None:
        """The backend key of `tenant` (created on first use; servers pick the key file up within a second)."""
        if self.creds is None:
            return None
        ensure_dev_credentials(self.run_dir, (tenant,))
        return self.creds.token(self.creds.backend_token(tenant))

    def channel(self, target: str, *, token: str | None = None, options: list[tuple[str, Any]] | None = None) -> Any:
        """A channel to one of the stack's services, as the operator (or as `token`)."""

        return open_channel(target, self.client_common, token=token, options=options or [])

    def _addresses(self, service: str) -> list[str]:
        """Where `service` answers: its first process, then its replicas."""
        ports = [self.ports, *(p for c, p in self.replica_ports.items() if service_of(c) == service)]
        return [f"127.0.0.1:{getattr(p, service)}" for p in ports]

    @property
    def inference_target(self) -> str:
        """Every inference pod, in one target (the first that answers serves; the next when it goes)."""
        return replica_target(self._addresses("inference"))

    @property
    def weights_target(self) -> str:
        return replica_target(self._addresses("weights"))

    @property
    def knowledge_target(self) -> str:
        return f"127.0.0.1:{self.ports.extractor}"

    @property
    def openai_base_url(self) -> str:
        """The inference pod's OpenAI-compatible door (the agent task's agents call it)."""
        return f"{'https' if self.creds is not None else 'http'}://localhost:{self.ports.http}/v1"

    @property
    def dashboard_url(self) -> str:
        return f"{'https' if self.creds is not None else 'http'}://localhost:{self.ports.dashboard}/"

    def start(self) -> None:
        if self.broker is not None:
            self.broker.start(topics=self.topics)       # its users and this namespace's ACLs
        elif self._starts is not None:
            self._starts.start(topics=self.topics)      # started (or reused) here: this process is its admin
            apply_client_env(self.common.home, ADMIN)
        elif self.sasl_dir is not None:                 # the local broker this process holds admin of
            apply_acls(admin(self.bootstrap, security=principal_security(self.sasl_dir, ADMIN)), grants(self.topics))
        su = principal_security(self.sasl_dir, ADMIN) if self.sasl_dir is not None else None
        ensure_topics(self.bootstrap, self.topics, security=su)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.supervisor.start_background()
        # `APPRENTICE_HOME=<run_dir> apprentice weights list` (or status, tail, ...) then finds this stack
        recorded = self.common.model_copy(update={"kafka_bootstrap": self.bootstrap, "model": self.model,
                                                  "topic_prefix": self.topics.prefix})
        own = stack_endpoints(self.ports, recorded, ca=self.creds.ca if self.creds else None,
                              operator_token=self.creds.operator_token if self.creds else None)
        write_endpoints(self.run_dir, own)
        if self.announce_in is not None:
            self._announced = announce_endpoints(self.announce_in, replace(own, home=str(self.run_dir)))

    def health(self) -> dict[str, bool]:
        """Child name -> answers (gRPC health, or a metrics endpoint for grader and trainer), for the services
        this stack runs."""
        health = {n: ok for n, ok in service_health(self.ports, self.client_common).items() if n in self.services}
        for child, ports in self.replica_ports.items():
            service = service_of(child)
            health[child] = (metrics_text(ports.metrics[service]) is not None if service == "grader"
                             else grpc_healthy(getattr(ports, service), self.client_common))
        return health

    def wait_healthy(self, timeout: float, names: tuple[str, ...] | None = None) -> dict[str, bool]:
        """Health of every service (or of `names`) once all are healthy, or at `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            h = self.health()
            if names is not None:
                h = {n: h[n] for n in names}
            if all(h.values()) or time.monotonic() >= deadline:
                return h
            time.sleep(1)

    def crashed(self) -> dict[str, list[int]]:
        return {c.name: c.exits for c in self.supervisor.children if c.exits}

    def stop(self, grace: float = 20.0) -> None:
        """Stop every service (SIGTERM, then SIGKILL after `grace` seconds each)."""

        self.supervisor.stop(grace)
        remove_endpoints(self.run_dir, os.getpid())
        if self._announced and self.announce_in is not None:
            remove_endpoints(self.announce_in, os.getpid())

