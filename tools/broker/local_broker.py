"""The local single-node KRaft broker: jars from Maven Central, data under `.apprentice/kafka/`.

Recipe in docs/architecture.md §10. `start` reuses any broker that already answers on the bootstrap address;
`stop` only stops a broker whose pid file this module wrote.

Whose broker answers is the broker's own word: its `log.dirs`, read over the Admin API (`serving_data_dir`).
A pid file says only what this home started; a broker on 9092 started from another checkout answers just
the same, and `apprentice up` used to reuse it silently while `kafka status` named this home's data folder,
which that broker never reads. `BrokerStatus.foreign` and `serving_home` say whose it is.

With `sasl_port` the broker also serves a SASL_PLAINTEXT listener there (SCRAM-SHA-512). Its one user
(`sasl_user`) gets a random password, generated once and kept in `<home>/kafka/sasl/<user>.password`
(mode 0600, outside the repository); the user is (re)created through the Admin API on every start, so a
broker formatted without SCRAM users gains them when restarted with SASL. The plain listener stays
(set-up, health probes, and clients that were configured for it); the controller listener is plaintext
on loopback.
"""

from __future__ import annotations

import base64
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
    ConfigResource,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from shared.kafka.admin import admin, broker_answers, wait_for_broker
from shared.kafka.security import PLAINTEXT, KafkaSecurity

if TYPE_CHECKING:
    from shared.settings import CommonSettings

POM = Path(__file__).with_name("pom.xml")
"""The Maven file naming the broker's jars: package data beside this module, so an installed wheel (which
has no source tree around it) can fetch them too."""
DEFAULT_PORT, DEFAULT_SASL_PORT = 9092, 9094
SCRAM_MECHANISM = "SCRAM-SHA-512"
SCRAM_ITERATIONS = 8192
"""PBKDF2 rounds of the stored SCRAM credential (Kafka's minimum is 4096)."""


class BrokerError(RuntimeError):
    """The local broker cannot be set up or started; the message says what to install or fix."""


@dataclass
class BrokerStatus:
    running: bool
    owned: bool
    pid: int | None
    bootstrap: str
    data_dir: Path
    sasl_bootstrap: str | None = None
    """The SASL_PLAINTEXT (SCRAM-SHA-512) listener, when this broker serves one."""
    serving_data_dir: Path | None = None
    """The data folder of the broker that answers at `bootstrap`, as it reports it (`log.dirs`): `data_dir`
    when it is this home's; None when none answers or it does not say."""

    @property
    def foreign(self) -> bool:
        """A broker answers at `bootstrap` but it is not this home's: it keeps its data elsewhere (or, when it
        does not say where, this home did not start it)."""
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


class LocalBroker:
    def __init__(self, home: Path, *, host: str = "127.0.0.1", port: int = 9092, controller_port: int = 9093,
                 heap: str = "512m", sasl_port: int | None = None, sasl_user: str = "apprentice",
                 sasl_password: str | None = None) -> None:
        """`sasl_port`: also serve SASL_PLAINTEXT (SCRAM-SHA-512) there, for `sasl_user` with
        `sasl_password` (None = the password generated once under `home`)."""
        self.home = home / "kafka"
        self.libs = self.home / "libs"
        self.data = self.home / "data"
        self.pid_file = self.home / "broker.pid"
        self.log_file = home / "logs" / "kafka.log"
        self.host, self.port, self.controller_port, self.heap = host, port, controller_port, heap
        if sasl_port in (port, controller_port):
            raise BrokerError(f"the SASL port {sasl_port} is already the broker's plain or controller port")
        self.sasl_port, self.sasl_user, self._sasl_password = sasl_port, sasl_user, sasl_password

    @classmethod
    def for_settings(cls, settings: CommonSettings, *, sasl: bool = False,
                     sasl_port: int = DEFAULT_SASL_PORT) -> LocalBroker:
        """The local broker that `settings` point at. `APPRENTICE_KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT`
        means the bootstrap address is the SASL listener: the plain listener then stays on 9092 and the
        SCRAM user is the configured one, with the configured password (so the clients' settings and the
        broker agree). `sasl` adds the SASL listener on `sasl_port` to a PLAINTEXT configuration."""
        host, _, port_s = settings.kafka_bootstrap.split(",")[0].rpartition(":")
        host, port = host or "127.0.0.1", int(port_s or DEFAULT_PORT)
        protocol = settings.kafka_security_protocol
        if protocol == "SASL_PLAINTEXT":
            if settings.kafka_sasl_mechanism != SCRAM_MECHANISM:
                raise BrokerError(f"the local broker's SASL listener speaks {SCRAM_MECHANISM}: set "
                                  f"APPRENTICE_KAFKA_SASL_MECHANISM={SCRAM_MECHANISM}")
            pw = settings.kafka_sasl_password
            return cls(settings.home, host=host, port=DEFAULT_PORT, sasl_port=port,
                       sasl_user=settings.kafka_sasl_username or "apprentice",
                       sasl_password=pw.get_secret_value() if pw is not None else None)
        if protocol != "PLAINTEXT":
            raise BrokerError(f"the local broker serves PLAINTEXT and SASL_PLAINTEXT, not {protocol}: point "
                              "APPRENTICE_KAFKA_BOOTSTRAP at a cluster with TLS listeners instead")
        # the controller listens next to the broker (9092 -> 9093, as ever): a second home's broker on
        # another port must not collide with the first one's controller on 9093
        return cls(settings.home, host=host, port=port, controller_port=port + 1,
                   sasl_port=sasl_port if sasl else None)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    # --- the SASL/SCRAM listener --------------------------------------------------------------------
    @property
    def sasl_bootstrap(self) -> str | None:
        return f"{self.host}:{self.sasl_port}" if self.sasl_port else None

    @property
    def sasl_password_file(self) -> Path:
        return self.home / "sasl" / f"{self.sasl_user}.password"

    def sasl_password(self) -> str:
        """The SCRAM user's password: the one given, else generated on first use (256 random bits) and
        read back from `sasl_password_file` afterwards."""
        if self._sasl_password is not None:
            return self._sasl_password
        f = self.sasl_password_file
        if not f.exists():
            f.parent.mkdir(parents=True, exist_ok=True)
            f.parent.chmod(0o700)
            try:  # O_EXCL: two concurrent starts must not end up with different passwords
                fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                pass
            else:
                with os.fdopen(fd, "w") as out:
                    out.write(secrets.token_urlsafe(32) + "\n")
        return f.read_text().removesuffix("\n")

    def sasl_security(self) -> KafkaSecurity:
        """Client security for the SASL listener (what `APPRENTICE_KAFKA_*` would configure)."""
        return KafkaSecurity(protocol="SASL_PLAINTEXT", mechanism=SCRAM_MECHANISM, username=self.sasl_user,
                             password=self.sasl_password())

    def sasl_env(self) -> dict[str, str]:
        """The environment that points every Apprentice client at the SASL listener (the password as the
        generated file's path; a password given to the constructor is the caller's to pass on)."""
        assert self.sasl_bootstrap, "the broker has no SASL listener (sasl_port)"
        env = {"APPRENTICE_KAFKA_BOOTSTRAP": self.sasl_bootstrap,
               "APPRENTICE_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
               "APPRENTICE_KAFKA_SASL_MECHANISM": SCRAM_MECHANISM,
               "APPRENTICE_KAFKA_SASL_USERNAME": self.sasl_user}
        if self._sasl_password is None:
            self.sasl_password()
            env["APPRENTICE_KAFKA_SASL_PASSWORD_FILE"] = str(self.sasl_password_file.resolve())
        return env

    def ensure_sasl_user(self, timeout: float = 30.0) -> None:
        """Create (or reset) the SCRAM user with the stored password, over the plain listener."""

        client = admin(self.bootstrap, security=PLAINTEXT)  # keep the handle: its futures die with it
        upsert = UserScramCredentialUpsertion(self.sasl_user, ScramCredentialInfo(
            ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS), self.sasl_password().encode())
        for fut in client.alter_user_scram_credentials([upsert], request_timeout=timeout).values():
            fut.result(timeout)

    def _sasl_answers(self, timeout: float = 2.0) -> bool:
        return self.sasl_bootstrap is not None and broker_answers(self.sasl_bootstrap, timeout,
                                                                  security=self.sasl_security())

    def _sasl_port_open(self) -> bool:
        with socket.socket() as s:
            s.settimeout(1.0)
            return s.connect_ex((self.host, self.sasl_port or 0)) == 0

    def _ready_sasl(self, timeout: float) -> None:
        """With a SASL listener: make sure its user exists and that it authenticates."""
        if self.sasl_port is None or self._sasl_answers():
            return
        if not self._sasl_port_open():
            raise BrokerError(f"the broker at {self.bootstrap} has no SASL listener on {self.sasl_bootstrap}: "
                              "it was started without one; stop it (`apprentice kafka stop`) and start it "
                              "again with `--sasl`")
        self.ensure_sasl_user(timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:  # the credential reaches the listener through the metadata log
            if self._sasl_answers(timeout=1.0):
                return
            time.sleep(0.2)
        raise BrokerError(f"the SASL listener {self.sasl_bootstrap} did not accept user {self.sasl_user!r} "
                          f"within {timeout:.0f}s; see {self.log_file}")

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

    def _properties(self) -> Path:
        props = self.home / "server.properties"
        listeners = f"PLAINTEXT://{self.host}:{self.port},CONTROLLER://{self.host}:{self.controller_port}"
        advertised = f"PLAINTEXT://{self.host}:{self.port}"
        protocols = "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
        sasl: list[str] = []
        if self.sasl_port:
            listeners += f",SASL_PLAINTEXT://{self.host}:{self.sasl_port}"
            advertised += f",SASL_PLAINTEXT://{self.host}:{self.sasl_port}"
            protocols += ",SASL_PLAINTEXT:SASL_PLAINTEXT"
            sasl = [f"listener.name.sasl_plaintext.sasl.enabled.mechanisms={SCRAM_MECHANISM}",
                    # The broker side of SCRAM needs a login module, without credentials of its own
                    # (SCRAM users live in the cluster metadata).
                    f"listener.name.sasl_plaintext.{SCRAM_MECHANISM.lower()}.sasl.jaas.config="
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;"]
        props.write_text("\n".join([
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.voters=1@{self.host}:{self.controller_port}",
            f"listeners={listeners}",
            f"advertised.listeners={advertised}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            f"listener.security.protocol.map={protocols}",
            *sasl,
            f"log.dirs={self.data.resolve()}",
            "num.partitions=3",
            "offsets.topic.replication.factor=1",
            "offsets.topic.num.partitions=10",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1",
            "group.initial.rebalance.delay.ms=0",
            "auto.create.topics.enable=true",
            "log.cleaner.backoff.ms=5000",
            "",
        ]))
        return props

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
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            self.pid_file.unlink(missing_ok=True)
            return None
        except PermissionError:
            pass
        return pid

    def serving_data_dir(self, timeout: float = 5.0) -> Path | None:
        """The data folder of the broker that answers at `bootstrap`, as it reports it: its `log.dirs`
        (the first one), read over the Admin API. Whatever started that broker, this names whose it is;
        None when none answers or it does not say (a cluster that refuses to describe its configs)."""

        try:
            client = admin(self.bootstrap, quiet=True, security=PLAINTEXT)
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

    def status(self) -> BrokerStatus:
        pid = self._owned_pid()
        running = broker_answers(self.bootstrap, security=PLAINTEXT)
        return BrokerStatus(running=running, owned=pid is not None,
                            pid=pid, bootstrap=self.bootstrap, data_dir=self.data,
                            sasl_bootstrap=self.sasl_bootstrap if self._sasl_answers() else None,
                            serving_data_dir=self.serving_data_dir() if running else None)

    def start(self, timeout: float = 90.0) -> BrokerStatus:
        """Start the broker unless one already answers; return once a metadata request succeeds (and,
        with `sasl_port`, once the SASL listener authenticates its user)."""
        if broker_answers(self.bootstrap, security=PLAINTEXT):
            self._ready_sasl(timeout)
            return self.status()
        pid = self._owned_pid()
        if pid is None:
            self.home.mkdir(parents=True, exist_ok=True)
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
            pid = proc.pid
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if broker_answers(self.bootstrap, timeout=1.0, security=PLAINTEXT):
                self._ready_sasl(max(10.0, deadline - time.monotonic()))
                return self.status()
            if self._owned_pid() is None:
                tail = self.log_file.read_text(errors="replace")[-3000:] if self.log_file.exists() else ""
                raise BrokerError(f"the Kafka broker exited during start-up; log tail:\n{tail}")
            time.sleep(0.5)
        raise BrokerError(f"the Kafka broker (pid {pid}) did not answer within {timeout:.0f}s; see {self.log_file}")

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop the broker this module started; return False when there was none of ours."""
        pid = self._owned_pid()
        if pid is None:
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            os.kill(pid, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)
        return True

    def wait_ready(self, timeout: float = 60.0) -> None:
        wait_for_broker(self.bootstrap, timeout, security=PLAINTEXT)
