"""The local single-node KRaft broker: jars from Maven Central, data under `.apprentice/kafka/`.

Recipe in docs/architecture.md §10. `start` reuses any broker that already answers on the bootstrap address;
`stop` only stops a broker whose pid file this module wrote.

Whose broker answers is the broker's own word: its `log.dirs`, read over the Admin API (`serving_data_dir`).
A pid file says only what this home started; a broker on 9092 started from another checkout answers just
the same, and `apprentice up` used to reuse it silently while `kafka status` named this home's data folder,
which that broker never reads. `BrokerStatus.foreign` and `serving_home` say whose it is.

The broker authenticates every client and authorizes every request (SECURITY.md §4): its one listener on
the bootstrap port speaks SASL_PLAINTEXT, with SCRAM-SHA-512 for the principals of
shared/contracts/topic_access.py (one user each) and PLAIN for `admin`, the super user declared in the
broker's own JAAS configuration (so it exists on a freshly formatted data folder and on one formatted by
the old plaintext configuration alike, before any SCRAM user does). Kafka's StandardAuthorizer with
`allow.everyone.if.no.acl.found=false` refuses whatever tools/broker/acls.py did not grant. The controller
listener and inter-broker traffic authenticate as `admin` over SASL PLAIN too (SCRAM cannot bootstrap a
KRaft controller: its users live in the metadata the controller serves).

Every password is generated once (256 random bits) under `<home>/kafka/sasl/<principal>.password` (folder
0700, files 0600, never in the repository); `server.properties`, which holds the admin password for the
JAAS line, is 0600 too. A plain listener exists only when asked for (`plaintext_port`, `apprentice kafka
start --plaintext-listener`): its clients are User:ANONYMOUS and are granted everything, i.e. exactly the
open door this configuration closes; never for anything but a legacy client on a trusted machine.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    ConfigResource,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialUpsertion,
)

from shared.contracts import topic_access as access
from shared.contracts.stack_endpoints import process_alive
from shared.kafka.admin import admin, broker_answers
from shared.kafka.security import KafkaSecurity
from tools.broker.acls import Grant, apply_acls, grants, open_door_grants
from tools.record_keys import ensure as ensure_record_keys
from tools.record_keys import records_dir

if TYPE_CHECKING:
    from shared.contracts.topics import Topics
    from shared.settings import CommonSettings

POM = Path(__file__).with_name("pom.xml")
"""The Maven file naming the broker's jars: package data beside this module, so an installed wheel (which
has no source tree around it) can fetch them too."""
DEFAULT_PORT, DEFAULT_PLAINTEXT_PORT = 9092, 9095
SCRAM_MECHANISM = "SCRAM-SHA-512"
"""How the principals of the access table authenticate."""
ADMIN_MECHANISM = "PLAIN"
"""How `admin` authenticates: declared in the broker's JAAS line, it needs no SCRAM user to exist."""
SCRAM_ITERATIONS = 8192
"""PBKDF2 rounds of the stored SCRAM credential (Kafka's minimum is 4096)."""
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
CLUSTER_FILE = "cluster.json"
"""`<home>/kafka/cluster.json`: the layout of a home's replicated cluster (tools/broker/cluster.py)."""
PORT_STEP = 100
"""A cluster's node i listens on port + PORT_STEP * (i - 1) (its controller on the next port)."""


def recorded_cluster_bootstrap(home: Path) -> str | None:
    """Every node's address of the cluster `home` records (tools/broker/cluster.py), None when it records none."""
    f = home / "kafka" / CLUSTER_FILE
    try:
        layout = json.loads(f.read_text())
        return ",".join(f"{layout['host']}:{int(layout['port']) + PORT_STEP * i}" for i in range(int(layout["brokers"])))
    except (OSError, ValueError, KeyError, TypeError):
        return None


class BrokerError(RuntimeError):
    """The local broker cannot be set up or started; the message says what to install or fix."""


@dataclass
class BrokerStatus:
    running: bool
    """A broker answers at `bootstrap` and accepts this home's admin credentials."""
    owned: bool
    pid: int | None
    bootstrap: str
    data_dir: Path
    serving_data_dir: Path | None = None
    """The data folder of the broker that answers at `bootstrap`, as it reports it (`log.dirs`): `data_dir`
    when it is this home's; None when none answers or it does not say."""
    refuses_admin: bool = False
    """Something listens at `bootstrap` but does not accept this home's admin credentials: another home's
    broker, or a broker started before authorization (a plaintext one)."""
    plaintext_bootstrap: str | None = None
    """The insecure plain listener, when this broker was asked for one."""

    @property
    def foreign(self) -> bool:
        """A broker answers at `bootstrap` but it is not this home's: it keeps its data elsewhere, refuses
        this home's admin, or (when it does not say where its data is) this home did not start it."""
        if self.refuses_admin:
            return True
        if not self.running:
            return False
        if self.serving_data_dir is not None:
            return self.serving_data_dir.resolve() != self.data_dir.resolve()
        return not self.owned

    @property
    def serving_home(self) -> Path | None:
        """The Apprentice home of the answering broker when its data folder is a local broker's
        (`<home>/kafka/data`), else None (another kind of broker, or it does not say)."""
        d = self.serving_data_dir
        if d is None or d.name != "data" or d.parent.name != "kafka":
            return None
        return d.parent.parent

    @property
    def serving_pid(self) -> int | None:
        """The pid recorded in the answering broker's home (`serving_home`), if that home has one."""
        home = self.serving_home
        if home is None:
            return None
        try:
            return int((home / "kafka" / "broker.pid").read_text().strip())
        except (OSError, ValueError):
            return None


def write_secret(path: Path, text: str, *, replace: bool) -> None:
    """Write `text` to `path` with mode 0600 in a 0700 folder. Without `replace`, an existing file wins
    (O_EXCL: two concurrent starts must not end up with different passwords); with it, the new file
    replaces the old one atomically (a reader sees one or the other, never half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o700)
    target = path.with_name(path.name + ".tmp") if replace else path
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if replace else os.O_EXCL), 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as out:
        out.write(text)
    if replace:
        target.replace(path)


class LocalBroker:
    def __init__(self, home: Path, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                 controller_port: int = 9093, heap: str = "512m", plaintext_port: int | None = None) -> None:
        """`port`: the SASL_PLAINTEXT listener every client uses. `plaintext_port`: also serve the insecure
        plain listener there (its clients, User:ANONYMOUS, may do anything; see the module docstring)."""
        self.home = home / "kafka"
        self.libs = self.home / "libs"
        self.data = self.home / "data"
        self.pid_file = self.home / "broker.pid"
        self.log_file = home / "logs" / "kafka.log"
        self.host, self.port, self.controller_port, self.heap = host, port, controller_port, heap
        if plaintext_port in (port, controller_port):
            raise BrokerError(f"the plaintext port {plaintext_port} is already the broker's SASL or controller port")
        self.plaintext_port = plaintext_port
        # one node of one voter; tools/broker/cluster.py's nodes set their id, the quorum and replication
        self.node_id = 1
        self.voters = f"1@{host}:{controller_port}"
        self.replication, self.min_insync = 1, 1

    @classmethod
    def for_settings(cls, settings: CommonSettings, *, plaintext_port: int | None = None) -> LocalBroker:
        """The local broker that `settings` point at: its SASL listener on the bootstrap address, the
        controller on the next port (9092 -> 9093, as ever: a second home's broker on another port must not
        collide with the first one's controller)."""
        host, _, port_s = settings.kafka_bootstrap.split(",")[0].rpartition(":")
        host, port = host or "127.0.0.1", int(port_s or DEFAULT_PORT)
        if settings.kafka_security_protocol not in ("PLAINTEXT", "SASL_PLAINTEXT"):
            raise BrokerError(f"the local broker serves SASL_PLAINTEXT, not {settings.kafka_security_protocol}: "
                              "point APPRENTICE_KAFKA_BOOTSTRAP at a cluster with TLS listeners instead")
        return cls(settings.home, host=host, port=port, controller_port=port + 1, plaintext_port=plaintext_port)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def plaintext_bootstrap(self) -> str | None:
        return f"{self.host}:{self.plaintext_port}" if self.plaintext_port else None

    # --- credentials ------------------------------------------------------------------------------
    @property
    def sasl_dir(self) -> Path:
        return self.home / "sasl"

    def password_file(self, principal: str) -> Path:
        return self.sasl_dir / f"{principal}.password"

    def password(self, principal: str = access.ADMIN) -> str:
        """`principal`'s password: generated on first use (256 random bits), read back afterwards."""
        f = self.password_file(principal)
        if not f.exists():
            write_secret(f, secrets.token_urlsafe(32) + "\n", replace=False)
        return f.read_text().removesuffix("\n")

    def security(self, principal: str = access.ADMIN) -> KafkaSecurity:
        """Client security of `principal` (admin: PLAIN; the table's principals: SCRAM-SHA-512)."""
        return KafkaSecurity(protocol="SASL_PLAINTEXT", username=principal, password=self.password(principal),
                             mechanism=ADMIN_MECHANISM if principal == access.ADMIN else SCRAM_MECHANISM)

    def client_env(self, principal: str) -> dict[str, str]:
        """The environment that makes an Apprentice process a client of this broker as `principal` (the
        password as its file's path, read by the client's settings at start)."""
        self.password(principal)
        self.ensure_record_keys()
        return {"APPRENTICE_KAFKA_BOOTSTRAP": self.bootstrap,
                "APPRENTICE_RECORD_KEYS_DIR": str(self.record_keys_dir.resolve()),
                "APPRENTICE_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                "APPRENTICE_KAFKA_SASL_MECHANISM": self.security(principal).mechanism,
                "APPRENTICE_KAFKA_SASL_USERNAME": principal,
                "APPRENTICE_KAFKA_SASL_PASSWORD_FILE": str(self.password_file(principal).resolve())}

    @property
    def record_keys_dir(self) -> Path:
        """The record-signing keys of this home's services (shared/kafka/signing.py), written beside the
        broker's credentials: the same home's stack, demo and tests sign and check with them."""
        return records_dir(self.home.parent)

    def ensure_record_keys(self) -> list[str]:
        """A record-signing key pair for every principal that writes a topic (kept once written)."""
        return ensure_record_keys(self.record_keys_dir)

    def admin_client(self) -> AdminClient:
        """An admin client that has read the cluster's metadata once: librdkafka replaces its bootstrap
        connection by the brokers the metadata names, failing a request in flight on it (_DESTROY_BROKER), which
        a first request on a fresh client to a node of a cluster otherwise meets."""
        client = admin(self.bootstrap, security=self.security(access.ADMIN))
        with contextlib.suppress(KafkaException):
            client.list_topics(timeout=10)
        return client

    def ensure_users(self, timeout: float = 30.0, principals: tuple[str, ...] = access.PRINCIPALS) -> None:
        """Give every principal its SCRAM credential with the password in its file (upserted on every start,
        so the broker always holds what the files say, on an old data folder too); return once the last
        one authenticates (credentials reach the listener through the metadata log)."""
        upserts: list[UserScramCredentialAlteration] = [UserScramCredentialUpsertion(p, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS),
                                                self.password(p).encode()) for p in principals]
        deadline = time.monotonic() + timeout
        while True:
            client = self.admin_client()  # keep the handle: its futures die with it
            try:
                for fut in client.alter_user_scram_credentials(upserts, request_timeout=timeout).values():
                    fut.result(max(1.0, deadline - time.monotonic()))
                break
            except KafkaException:
                # A fresh cluster under load can still replace the admin's connection mid-request
                # (_DESTROY_BROKER, seen once in five chaos runs) or time it out while its controller
                # settles; an upsert is idempotent, so it is sent again on a new client until the deadline.
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        deadline = time.monotonic() + timeout
        while not broker_answers(self.bootstrap, timeout=1.0, security=self.security(principals[-1])):
            if time.monotonic() > deadline:
                raise BrokerError(f"the broker at {self.bootstrap} did not accept user {principals[-1]!r} within "
                                  f"{timeout:.0f}s; see {self.log_file}")
            time.sleep(0.2)

    def rotate(self, principal: str, timeout: float = 30.0) -> None:
        """A new password for `principal`: its file replaced, its SCRAM credential updated. Running clients
        keep their connections; a process started afterwards reads the new file (restart the service).
        The admin's password is the broker's JAAS line: it takes effect when the broker restarts."""
        write_secret(self.password_file(principal), secrets.token_urlsafe(32) + "\n", replace=True)
        if principal != access.ADMIN:
            self.ensure_users(timeout, (principal,))

    def ensure_access(self, topics: Topics | None = None, timeout: float = 30.0) -> list[Grant]:
        """Users, then the ACLs of the deployment of `topics` (and the open door on ANONYMOUS when this broker
        serves a plain listener); returns the bindings created (none when all were there)."""
        self.ensure_users(timeout)
        self.ensure_record_keys()
        wanted = grants(topics) + (open_door_grants() if self.plaintext_port else [])
        return apply_acls(self.admin_client(), wanted, timeout)

    def _answers(self, timeout: float = 2.0) -> bool:
        return broker_answers(self.bootstrap, timeout, security=self.security(access.ADMIN))

    def _port_open(self) -> bool:
        with socket.socket() as s:
            s.settimeout(1.0)
            return s.connect_ex((self.host, self.port)) == 0

    # --- set-up -----------------------------------------------------------------------------------
    def fetch_jars(self) -> Path:
        """Resolve the broker's jars with Maven once; later calls reuse them (and ~/.m2)."""
        marker = self.libs / ".complete"
        if marker.exists() and marker.read_text() == POM.read_text():
            return self.libs
        if shutil.which("mvn") is None:
            raise BrokerError("Maven (`mvn`) is needed to fetch Kafka's jars from Maven Central: "
                              "install it (e.g. `apt-get install maven`) or set APPRENTICE_KAFKA_BOOTSTRAP "
                              "to an existing cluster")
        self._need_java()
        tmp = self.libs.with_name("libs.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        cmd = ["mvn", "-B", "-q", "-f", str(POM), "dependency:copy-dependencies", "-DincludeScope=runtime",
               f"-DoutputDirectory={tmp.resolve()}"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BrokerError(f"mvn could not resolve Kafka's jars:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        shutil.rmtree(self.libs, ignore_errors=True)
        tmp.rename(self.libs)
        marker.write_text(POM.read_text())
        return self.libs

    @staticmethod
    def _need_java() -> str:
        java = shutil.which("java")
        if java is None:
            raise BrokerError("Java 17+ is needed to run the local Kafka broker: install a JDK "
                              "(e.g. `apt-get install openjdk-17-jre-headless`) or set APPRENTICE_KAFKA_BOOTSTRAP")
        return java

    @property
    def properties_file(self) -> Path:
        return self.home / "server.properties"

    def properties(self) -> list[str]:
        """The broker's configuration lines (holding the admin password: written 0600)."""
        pw = self.password(access.ADMIN)
        plain_admin = ("org.apache.kafka.common.security.plain.PlainLoginModule required "
                       f'username="{access.ADMIN}" password="{pw}" user_{access.ADMIN}="{pw}";')
        listeners = [f"SASL_PLAINTEXT://{self.host}:{self.port}"]
        protocols = ["SASL_PLAINTEXT:SASL_PLAINTEXT", "CONTROLLER:SASL_PLAINTEXT"]
        if self.plaintext_port:
            listeners.append(f"PLAINTEXT://{self.host}:{self.plaintext_port}")
            protocols.append("PLAINTEXT:PLAINTEXT")
        return [
            "process.roles=broker,controller",
            f"node.id={self.node_id}",
            f"controller.quorum.voters={self.voters}",
            f"listeners={','.join(listeners)},CONTROLLER://{self.host}:{self.controller_port}",
            f"advertised.listeners={','.join(listeners)}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=SASL_PLAINTEXT",
            f"listener.security.protocol.map={','.join(protocols)}",
            # who is who: admin over PLAIN (declared here), every other principal over SCRAM (its
            # credential in the cluster metadata, tools/broker/acls.py's users)
            f"sasl.mechanism.inter.broker.protocol={ADMIN_MECHANISM}",
            f"sasl.mechanism.controller.protocol={ADMIN_MECHANISM}",
            f"listener.name.sasl_plaintext.sasl.enabled.mechanisms={SCRAM_MECHANISM},{ADMIN_MECHANISM}",
            f"listener.name.sasl_plaintext.plain.sasl.jaas.config={plain_admin}",
            f"listener.name.sasl_plaintext.{SCRAM_MECHANISM.lower()}.sasl.jaas.config="
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            f"listener.name.controller.sasl.enabled.mechanisms={ADMIN_MECHANISM}",
            f"listener.name.controller.plain.sasl.jaas.config={plain_admin}",
            # what each may do: only what an ACL grants (admin is the super user)
            f"authorizer.class.name={AUTHORIZER}",
            "allow.everyone.if.no.acl.found=false",
            f"super.users=User:{access.ADMIN}",
            f"log.dirs={self.data.resolve()}",
            "num.partitions=3",
            # the internal topics (offsets, transactions) as replicated as the contract topics
            f"default.replication.factor={self.replication}",
            f"min.insync.replicas={self.min_insync}",
            f"offsets.topic.replication.factor={self.replication}",
            "offsets.topic.num.partitions=10",
            f"transaction.state.log.replication.factor={self.replication}",
            f"transaction.state.log.min.isr={self.min_insync}",
            f"share.coordinator.state.topic.replication.factor={self.replication}",
            f"share.coordinator.state.topic.min.isr={self.min_insync}",
            "group.initial.rebalance.delay.ms=0",
            # only a principal with CREATE on the topic gets one created by a metadata request: admin
            "auto.create.topics.enable=true",
            "log.cleaner.backoff.ms=5000",
            "",
        ]

    def _properties(self) -> Path:
        write_secret(self.properties_file, "\n".join(self.properties()), replace=True)
        return self.properties_file

    def _started_secured(self) -> bool:
        """Whether this home's broker was started with an authorizer (else: by the old plaintext config)."""
        try:
            return f"authorizer.class.name={AUTHORIZER}" in self.properties_file.read_text()
        except OSError:
            return False

    def _classpath(self) -> str:
        return str(self.libs.resolve() / "*")

    def _format(self, props: Path) -> None:
        if (self.data / "meta.properties").exists():
            return
        self.data.mkdir(parents=True, exist_ok=True)
        cluster_id = self._cluster_id()
        proc = subprocess.run([self._need_java(), "-cp", self._classpath(), "kafka.tools.StorageTool", "format",
                               "-t", cluster_id, "-c", str(props)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise BrokerError(f"formatting Kafka storage failed: {proc.stdout[-1500:]}{proc.stderr[-1500:]}")

    @staticmethod
    def _cluster_id() -> str:
        while True:  # an id starting with "-" reads as an option to kafka-storage (as Kafka's Uuid avoids)
            cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            if not cid.startswith("-"):
                return cid

    # --- life cycle -------------------------------------------------------------------------------
    def _owned_pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        if not process_alive(pid):
            self.pid_file.unlink(missing_ok=True)
            return None
        return pid

    def serving_data_dir(self, timeout: float = 5.0) -> Path | None:
        """The data folder of the broker that answers at `bootstrap`, as it reports it: its `log.dirs`
        (the first one), read over the Admin API as admin. Whatever started that broker, this names whose
        it is; None when none answers or it does not say (a cluster that refuses to describe its configs)."""

        try:
            client = admin(self.bootstrap, quiet=True, security=self.security(access.ADMIN))
            brokers = client.list_topics(timeout=timeout).brokers
            # the broker listening on this port (a cluster has several; the local broker is node 1)
            node = next((b.id for b in brokers.values() if b.port == self.port), next(iter(brokers), None))
            if node is None:
                return None
            futures = client.describe_configs([ConfigResource(ResourceType.BROKER, str(node))],
                                              request_timeout=timeout)
            config = next(iter(futures.values())).result(timeout)
        except (KafkaException, StopIteration, TimeoutError, ValueError):
            return None
        entry = config.get("log.dirs") or config.get("log.dir")
        first = (entry.value or "").split(",")[0].strip() if entry is not None else ""
        return Path(first) if first else None

    def listening_process_data_dir(self) -> Path | None:
        """The data folder of the local broker process that listens on this port, read from the configuration
        file on its command line (`kafka.Kafka <server.properties>`): whose broker it is when it refuses this
        home's admin and so cannot be asked. None when no local broker process listens there."""
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                args = cmdline.read_bytes().split(b"\0")
                props = Path(args[args.index(b"kafka.Kafka") + 1].decode())
                conf = dict(line.split("=", 1) for line in props.read_text().splitlines()
                            if "=" in line and not line.startswith("#"))
            except (OSError, ValueError, IndexError, UnicodeDecodeError):
                continue
            if any(entry.endswith(f"//{self.host}:{self.port}") for entry in conf.get("listeners", "").split(",")):
                first = conf.get("log.dirs", conf.get("log.dir", "")).split(",")[0].strip()
                return Path(first) if first else None
        return None

    def status(self) -> BrokerStatus:
        pid = self._owned_pid()
        running = self._answers()
        refuses = not running and self._port_open()
        serving = self.serving_data_dir() if running else self.listening_process_data_dir() if refuses else None
        return BrokerStatus(running=running, owned=pid is not None, pid=pid, bootstrap=self.bootstrap,
                            data_dir=self.data, serving_data_dir=serving, refuses_admin=refuses,
                            plaintext_bootstrap=self.plaintext_bootstrap if running else None)

    def refusal(self) -> str:
        """Why a broker that listens at `bootstrap` but refuses this home's admin cannot be used."""
        return (f"a broker listens at {self.bootstrap} but refuses this home's admin credentials "
                f"({self.password_file(access.ADMIN)}): it is another home's broker, or one started before "
                "authorization (plaintext). Stop it (`APPRENTICE_HOME=<its home> apprentice kafka stop`), or "
                "give this home a broker of its own on another port (APPRENTICE_KAFKA_BOOTSTRAP=127.0.0.1:29092)")

    def start(self, timeout: float = 90.0, topics: Topics | None = None) -> BrokerStatus:
        """Start the broker unless this home's already answers; return once admin is accepted and every
        principal's SCRAM user and the ACLs of the deployment of `topics` (default: no prefix) exist.
        This home's broker still running the old plaintext configuration is restarted with the secured one
        (same data folder); another broker on the port that refuses this home's admin is an error."""
        if self._answers():
            self.ensure_access(topics, timeout=max(30.0, timeout / 3))
            return self.status()
        pid = self._owned_pid()
        if self._port_open():
            if pid is None:
                raise BrokerError(self.refusal())
            if not self._started_secured():   # ours, from before authorization: restart it secured
                self.stop()
                pid = None
        if pid is None:
            pid = self.launch()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._answers(timeout=1.0):
                self.ensure_access(topics, timeout=max(10.0, deadline - time.monotonic()))
                return self.status()
            self.check_alive()
            time.sleep(0.5)
        raise BrokerError(f"the Kafka broker (pid {pid}) did not answer within {timeout:.0f}s; see {self.log_file}")

    def launch(self) -> int:
        """Write the configuration, format the data folder once, start the JVM; its pid (not yet answering)."""
        self.pid_file.parent.mkdir(parents=True, exist_ok=True)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self.fetch_jars()
        props = self._properties()
        self._format(props)
        log = open(self.log_file, "ab")  # noqa: SIM115 - handed to the child process
        env = dict(os.environ, KAFKA_HEAP_OPTS=f"-Xmx{self.heap}")
        proc = subprocess.Popen(
            [self._need_java(), f"-Xmx{self.heap}", "-Xms128m", "-XX:+UseG1GC",
             "-Djava.awt.headless=true", f"-Dkafka.logs.dir={self.log_file.parent.resolve()}",
             "-cp", self._classpath(), "kafka.Kafka", str(props)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        self.pid_file.write_text(str(proc.pid))
        return proc.pid

    def check_alive(self) -> None:
        """`BrokerError` with the log's tail when the JVM this home started has exited."""
        if self._owned_pid() is None:
            tail = self.log_file.read_text(errors="replace")[-3000:] if self.log_file.exists() else ""
            raise BrokerError(f"the Kafka broker exited during start-up; log tail:\n{tail}")

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop the broker this module started; return False when there was none of ours."""
        pid = self._owned_pid()
        if pid is None:
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not process_alive(pid):
                break
            time.sleep(0.2)
        else:
            os.kill(pid, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)
        return True

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not self._answers():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no Kafka broker accepted admin at {self.bootstrap} within {timeout:.0f}s")
            time.sleep(0.5)


def local_credentials_dir(environ: dict[str, str] | os._Environ[str]) -> Path | None:
    """The credentials folder of the local broker whose password file `environ` names
    (`<home>/kafka/sasl/<principal>.password`), else None (no SASL, or credentials of the user's own: a
    stack then leaves its services' Kafka settings as the user set them)."""
    f = environ.get("APPRENTICE_KAFKA_SASL_PASSWORD_FILE")
    if not f or environ.get("APPRENTICE_KAFKA_SECURITY_PROTOCOL", "").upper() != "SASL_PLAINTEXT":
        return None
    d = Path(f).parent
    return d if d.name == "sasl" and d.parent.name == "kafka" and (d / f"{access.ADMIN}.password").exists() else None


def principal_env(sasl_dir: Path, principal: str) -> dict[str, str]:
    """The Kafka client variables of `principal` with the local broker's credentials in `sasl_dir` (the
    bootstrap address stays what the process already has)."""
    return {"APPRENTICE_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "APPRENTICE_KAFKA_SASL_MECHANISM": ADMIN_MECHANISM if principal == access.ADMIN else SCRAM_MECHANISM,
            "APPRENTICE_KAFKA_SASL_USERNAME": principal,
            "APPRENTICE_KAFKA_SASL_PASSWORD_FILE": str((sasl_dir / f"{principal}.password").resolve()),
            "APPRENTICE_KAFKA_SASL_PASSWORD": "",
            # <home>/kafka/sasl -> <home>'s record-signing keys
            "APPRENTICE_RECORD_KEYS_DIR": str(records_dir(sasl_dir.parent.parent).resolve())}


def principal_security(sasl_dir: Path, principal: str) -> KafkaSecurity:
    """`principal`'s client security with the local broker's credentials in `sasl_dir`."""
    return KafkaSecurity(protocol="SASL_PLAINTEXT", username=principal,
                         password=(sasl_dir / f"{principal}.password").read_text().removesuffix("\n"),
                         mechanism=ADMIN_MECHANISM if principal == access.ADMIN else SCRAM_MECHANISM)


def apply_client_env(home: Path, principal: str, environ: os._Environ[str] | dict[str, str] | None = None) -> bool:
    """Make this process a client of `home`'s local broker as `principal` (the CLI: `operator`): fill the
    Kafka client variables with its credentials, unless the environment sets Kafka security of its own or
    the broker has not generated them yet. Returns whether it did."""
    env = os.environ if environ is None else environ
    if env.get("APPRENTICE_KAFKA_SECURITY_PROTOCOL") or env.get("APPRENTICE_KAFKA_SASL_USERNAME"):
        return False
    sasl_dir = home / "kafka" / "sasl"
    if not (sasl_dir / f"{principal}.password").exists():
        return False
    env.update(principal_env(sasl_dir, principal))
    if not env.get("APPRENTICE_KAFKA_BOOTSTRAP") and (cluster := recorded_cluster_bootstrap(home)) is not None:
        env["APPRENTICE_KAFKA_BOOTSTRAP"] = cluster      # every node: clients find it with one down
    return True
