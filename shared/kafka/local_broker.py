"""The local single-node KRaft broker: jars from Maven Central, data under `.apprentice/kafka/`.

Recipe in DESIGN.md section 5. `start` reuses any broker that already answers on the bootstrap address;
`stop` only stops a broker whose pid file this module wrote.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from shared.kafka.admin import broker_answers, wait_for_broker

REPO_ROOT = Path(__file__).resolve().parents[2]
POM = REPO_ROOT / "compose" / "kafka" / "pom.xml"


class BrokerError(RuntimeError):
    """The local broker cannot be set up or started; the message says what to install or fix."""


@dataclass
class BrokerStatus:
    running: bool
    owned: bool
    pid: int | None
    bootstrap: str
    data_dir: Path


class LocalBroker:
    def __init__(self, home: Path, *, host: str = "127.0.0.1", port: int = 9092, controller_port: int = 9093,
                 heap: str = "512m") -> None:
        self.home = home / "kafka"
        self.libs = self.home / "libs"
        self.data = self.home / "data"
        self.pid_file = self.home / "broker.pid"
        self.log_file = home / "logs" / "kafka.log"
        self.host, self.port, self.controller_port, self.heap = host, port, controller_port, heap

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

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
        props.write_text("\n".join([
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.voters=1@{self.host}:{self.controller_port}",
            f"listeners=PLAINTEXT://{self.host}:{self.port},CONTROLLER://{self.host}:{self.controller_port}",
            f"advertised.listeners=PLAINTEXT://{self.host}:{self.port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
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
        import base64

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

    def status(self) -> BrokerStatus:
        pid = self._owned_pid()
        return BrokerStatus(running=broker_answers(self.bootstrap), owned=pid is not None, pid=pid,
                            bootstrap=self.bootstrap, data_dir=self.data)

    def start(self, timeout: float = 90.0) -> BrokerStatus:
        """Start the broker unless one already answers; return once a metadata request succeeds."""
        if broker_answers(self.bootstrap):
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
            if broker_answers(self.bootstrap, timeout=1.0):
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
        wait_for_broker(self.bootstrap, timeout)
