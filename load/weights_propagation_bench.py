"""Propagation: publish a version -> all inference replicas serving it, vs a raw copy of its bytes; under load.

    python load/weights_propagation_bench.py                         # SmolLM2-135M, 3 replicas, full + LoRA
    python load/weights_propagation_bench.py --model tiny-random --kinds full,lora --replicas 3
    python load/weights_propagation_bench.py --engines transformers,vllm --replicas 2   # + vLLM on CPU

Everything is real and local: the Kafka broker (must answer at APPRENTICE_KAFKA_BOOTSTRAP, e.g. after
`apprentice kafka start`), the weights service and N inference replicas as separate processes
(`python -m services.weights`, `python -m services.inference`), in a fresh topic namespace.

For each kind (full weights, LoRA adapter): upload the version, start the clock, `Promote` it (force:
the eval gate is not part of propagation), and stop the clock when every replica has answered a request
with `policy_version` = the new version (the load keeps each replica busy, so this is "serving", not
"loaded"). Load: `--load-threads` concurrent Generate callers per replica for the whole run; every
failed request is counted. Baseline in the same run: copying the version's bytes (shutil.copyfile, the
kernel's fast path, page cache only, no fsync) once, and once per replica. The pods' downloads are
durable (fsync) and sha256-verified, and "serving" includes one request on the new version (see the
req p50 column): for a small LoRA adapter the ratio therefore measures fixed costs, not bytes.
With `--keep --log-level INFO` the pods' logs time each step ("model update", "version downloaded",
"version ready" with seconds).
`--engines transformers,vllm` runs the same promotions on each engine in turn (fresh topics, weights
service and replicas each; vLLM replicas run in `.venv-vllm`, `make setup-vllm`) and prints the ratio of
the engines' "all s". When full weights are promoted first, the adapter is one of those weights (the vLLM
engine holds one set of full weights and its adapters).
Prints a table; exit code 1 when a request failed or the ratio to the per-replica copy exceeds the target.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from shared.contracts.topic_access import ADMIN  # noqa: E402
from shared.settings import default_home  # noqa: E402
from tests.helpers.ports import free_port  # noqa: E402
from tools.broker.local_broker import apply_client_env  # noqa: E402

TARGET = 2.0


@dataclass
class Load:
    """Generate callers against every replica; records (time, replica, version) of each answer."""

    targets: list[str]
    threads: int
    max_new_tokens: int
    answers: list[tuple[float, int, str, float]] = field(default_factory=list)  # (end, replica, version, latency)
    errors: Counter[str] = field(default_factory=Counter)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    callers: list[threading.Thread] = field(default_factory=list)

    def run(self) -> list[threading.Thread]:
        self.callers = [threading.Thread(target=self._caller, args=(i,), daemon=True)
                        for i in range(len(self.targets)) for _ in range(self.threads)]
        for t in self.callers:
            t.start()
        return self.callers

    def finish(self, timeout: float = 120.0) -> None:
        """Stop issuing requests and wait for the ones in flight: the replicas are shut down only after,
        so a request cut by the benchmark's own teardown is not counted as a failure."""
        self.stop.set()
        deadline = time.monotonic() + timeout
        for t in self.callers:
            t.join(max(0.0, deadline - time.monotonic()))

    def _caller(self, replica: int) -> None:
        import grpc

        from services.inference.client import InferenceClient

        with InferenceClient(self.targets[replica], timeout=120) as c:
            n = 0
            while not self.stop.is_set():
                n += 1
                try:
                    t0 = time.monotonic()
                    r = c.generate(f"Tell me something about number {n}.", max_new_tokens=self.max_new_tokens)
                    with self.lock:
                        self.answers.append((time.monotonic(), replica, r.policy_version, time.monotonic() - t0))
                except grpc.RpcError as e:
                    with self.lock:
                        self.errors[f"{e.code().name}: {e.details()[:80]}"] += 1

    def first_serving(self, version: str, since: float) -> dict[int, float]:
        with self.lock:
            out: dict[int, float] = {}
            for t, replica, v, _lat in self.answers:
                if v == version and t >= since and replica not in out:
                    out[replica] = t
            return out

    def latency(self, since: float, until: float) -> float:
        """Median request latency of the answers in [since, until]: a replica counts as serving a version
        only once a request on it completed, so propagation includes about one of these."""
        with self.lock:
            lat = sorted(x for t, _r, _v, x in self.answers if since <= t <= until)
        return lat[len(lat) // 2] if lat else float("nan")


def make_versions(model_name: str, tmp: Path, kinds: list[str]) -> dict[str, Path]:
    """The versions to promote: full weights a hair away from the base (same answers), a random LoRA."""
    import torch

    from shared.models import load_model
    from shared.weights.client import save_version_files

    out = {}
    if "full" in kinds:
        model, _ = load_model(model_name)
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 1e-4)  # a different version, same behaviour
        save_version_files(model, tmp / "full", "full")
        out["full"] = tmp / "full"
        del model
    if "lora" in kinds:
        from peft import LoraConfig, get_peft_model

        base, _ = load_model(model_name)
        peft = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj",
                                                                                     "o_proj"]))
        save_version_files(peft, tmp / "lora", "lora")
        out["lora"] = tmp / "lora"
    return out


@dataclass
class EngineRun:
    """One engine's propagation rows (per kind) and the load that ran during them."""

    engine: str
    rows: list[tuple[Any, ...]]
    load: Load


def replica_python(engine: str) -> str:
    """The interpreter of the replicas: vLLM lives in its own venv (`make setup-vllm`), torch 2.13 there."""
    if engine == "vllm":
        venv = REPO / ".venv-vllm" / "bin" / "python"
        if not venv.exists():
            raise SystemExit("the vllm engine needs `make setup-vllm` (.venv-vllm) first")
        return str(venv)
    return sys.executable


def run_engine(args: argparse.Namespace, engine: str, kinds: list[str], versions: dict[str, Path], bootstrap: str,
               tmp: Path) -> EngineRun:
    """Weights service + N replicas of `engine` in a fresh topic namespace; promote each kind under load."""
    import grpc

    from shared.contracts.topics import Topics
    from shared.kafka.admin import delete_topics, ensure_topics
    from shared.proto.apprentice.v1 import weights_pb2, weights_pb2_grpc
    from shared.weights.client import upload_version

    topics = Topics(prefix=f"bench-{uuid.uuid4().hex[:8]}.")
    ensure_topics(bootstrap, topics)
    tmp.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, APPRENTICE_TOPIC_PREFIX=topics.prefix, APPRENTICE_KAFKA_BOOTSTRAP=bootstrap,
               APPRENTICE_MODEL=args.model, APPRENTICE_HOME=str(tmp / "home"), APPRENTICE_LOG_JSON="false",
               APPRENTICE_LOG_LEVEL=args.log_level, APPRENTICE_TORCH_THREADS=str(args.torch_threads),
               OMP_NUM_THREADS=str(args.torch_threads), PYTHONUNBUFFERED="1")
    procs: list[subprocess.Popen[bytes]] = []
    load: Load | None = None
    rows: list[tuple[Any, ...]] = []
    try:
        wport = free_port()
        wenv = dict(env, APPRENTICE_WEIGHTS_STORE__DIR=str(tmp / "store"), APPRENTICE_WEIGHTS_METRICS_PORT="0",
                    APPRENTICE_WEIGHTS_HOST="127.0.0.1", APPRENTICE_WEIGHTS_ORDER_DEADLINE_S="600")
        procs.append(subprocess.Popen([sys.executable, "-m", "services.weights", "--port", str(wport),
                                       "--policy", "manual"], env=wenv, cwd=REPO,
                                      stdout=open(tmp / "weights.log", "wb"),  # noqa: SIM115 - owned by the child
                                      stderr=subprocess.STDOUT))
        ports = [free_port() for _ in range(args.replicas)]
        python = replica_python(engine)
        for i, port in enumerate(ports):
            ienv = dict(env, APPRENTICE_INFERENCE_POD_ID=f"bench-{i}", APPRENTICE_INFERENCE_HOST="127.0.0.1",
                        APPRENTICE_INFERENCE_WEIGHTS_ENDPOINT=f"127.0.0.1:{wport}",
                        APPRENTICE_INFERENCE_METRICS_PORT="0", APPRENTICE_INFERENCE_HTTP_PORT="0",
                        APPRENTICE_INFERENCE_HEARTBEAT_INTERVAL_S="0.5", APPRENTICE_INFERENCE_ENGINE__KIND=engine)
            if engine == "vllm":
                ienv.update(APPRENTICE_INFERENCE_ENGINE__ENFORCE_EAGER="true",
                            VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
            procs.append(subprocess.Popen([python, "-m", "services.inference", "--port", str(port)],
                                          env=ienv, cwd=REPO,
                                          stdout=open(tmp / f"inference-{i}.log", "wb"),  # noqa: SIM115
                                          stderr=subprocess.STDOUT))
        channel = grpc.insecure_channel(f"127.0.0.1:{wport}", options=[("grpc.max_send_message_length", 64 << 20)])
        stub = weights_pb2_grpc.WeightsStub(channel)
        grpc.channel_ready_future(channel).result(timeout=120)

        from services.inference.client import InferenceClient

        targets = [f"127.0.0.1:{p}" for p in ports]
        deadline = time.monotonic() + args.start_timeout
        for t in targets:  # every replica answers before the clock starts
            while True:
                try:
                    with InferenceClient(t, timeout=60) as c:
                        c.generate("hi", max_new_tokens=1)
                    break
                except grpc.RpcError:
                    if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                        raise RuntimeError(f"replica {t} did not start; see {tmp}/inference-*.log") from None
                    time.sleep(1.0)
        print(f"[{engine}] weights + {args.replicas} replicas up; load: {args.load_threads} callers per replica",
              flush=True)
        load = Load(targets, args.load_threads, args.max_new_tokens)
        load.run()
        time.sleep(2.0)

        promoted_full = ""
        for kind in kinds:
            src = versions[kind]
            t0 = time.monotonic()
            # An adapter applies to the full weights being served: the vLLM engine holds one set of full
            # weights, so after a full promotion the new adapter is one of the new weights.
            base = (promoted_full or "base") if kind == "lora" else ""
            header = weights_pb2.UploadHeader(model=args.model, kind=kind, base_version=base)
            m = upload_version(stub, header, src)
            upload_s = time.monotonic() - t0
            size = sum(f.size for f in m.files)
            blobs = [tmp / "store" / "blobs" / f.sha256[:2] / f.sha256 for f in m.files]
            copies = []
            for i in range(args.replicas):  # the baseline: the same bytes, copied to each replica's folder
                dest = tmp / "copies" / str(i)
                dest.mkdir(parents=True)
                c0 = time.monotonic()
                for j, b in enumerate(blobs):
                    shutil.copyfile(b, dest / f"f{j}")
                copies.append(time.monotonic() - c0)
            shutil.rmtree(tmp / "copies")

            t0 = time.monotonic()
            stub.Promote(weights_pb2.PromoteRequest(model=args.model, version=m.version, force=True,
                                                    reason="propagation benchmark"), timeout=60)
            publish_s = time.monotonic() - t0
            while len(load.first_serving(m.version, t0)) < args.replicas:
                if time.monotonic() - t0 > args.timeout:
                    raise RuntimeError(f"{kind} {m.version} not served by every replica within {args.timeout}s")
                if any(p.poll() is not None for p in procs):
                    raise RuntimeError(f"a process exited; see logs in {tmp}")
                time.sleep(0.05)
            firsts = load.first_serving(m.version, t0)
            all_s = max(firsts.values()) - t0
            while not stub.Status(weights_pb2.StatusRequest(model=args.model)).converged:
                time.sleep(0.1)
            converged_s = time.monotonic() - t0
            rows.append((kind, m.version, size, upload_s, copies[0], sum(copies), publish_s,
                         min(firsts.values()) - t0, all_s, converged_s, load.latency(t0, t0 + all_s)))
            if kind == "full":
                promoted_full = m.version
            print(f"[{engine}] {kind} {m.version}: every replica serving after {all_s:.2f}s", flush=True)
        time.sleep(1.0)
    finally:
        if load is not None:
            load.finish()
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        delete_topics(bootstrap, [s.name for s in topics.specs()])
    assert load is not None
    return EngineRun(engine, rows, load)


def main(argv: list[str] | None = None) -> int:
    # against the local broker (SASL only, authorizing): this benchmark sets up its own topics, so it runs
    # as that broker's admin unless the environment sets Kafka credentials (docs/deployment.md)
    apply_client_env(default_home(), ADMIN)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--engines", default="transformers",
                    help="comma-separated, run one after the other: transformers, vllm (.venv-vllm, CPU build)")
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--kinds", default="full,lora")
    ap.add_argument("--load-threads", type=int, default=2, help="concurrent callers per replica")
    ap.add_argument("--max-new-tokens", type=int, default=4)
    ap.add_argument("--torch-threads", type=int, default=1, help="per replica (the machine has few cores)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per propagation before giving up")
    ap.add_argument("--start-timeout", type=float, default=300.0, help="seconds for the replicas to answer")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (logs)")
    ap.add_argument("--log-level", default="WARNING", help="of the weights and inference processes (with --keep)")
    args = ap.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    engines = [e for e in args.engines.split(",") if e]

    from shared.kafka.admin import broker_answers
    from shared.settings import CommonSettings

    bootstrap = CommonSettings().kafka_bootstrap
    if not broker_answers(bootstrap):
        print(f"no Kafka broker at {bootstrap}: run `apprentice kafka start` first", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="propagation-bench-"))
    runs: list[EngineRun] = []
    try:
        print(f"preparing {', '.join(kinds)} versions of {args.model} ...", flush=True)
        versions = make_versions(args.model, tmp / "versions", kinds)
        for engine in engines:
            runs.append(run_engine(args, engine, kinds, versions, bootstrap, tmp / engine))
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    print(f"\nmodel {args.model}, {args.replicas} replicas, {os.cpu_count()} CPUs, "
          f"{args.load_threads} callers/replica, {args.max_new_tokens} new tokens per request")
    head = (f"{'engine':<12} {'kind':<5} {'version':<7} {'MB':>7} {'upload s':>9} {'copy 1x s':>9} {'copy Nx s':>9} "
            f"{'order s':>8} {'first s':>8} {'all s':>8} {'status s':>8} {'req p50 s':>9} {'all/copyNx':>10} "
            f"{'all/copy1x':>10}")
    print(head)
    worst = 0.0
    failed = 0
    for r in runs:
        for kind, v, size, up, c1, cn, pub, first, all_s, conv, lat in r.rows:
            worst = max(worst, all_s / cn)
            print(f"{r.engine:<12} {kind:<5} {v:<7} {size / 1e6:>7.1f} {up:>9.2f} {c1:>9.3f} {cn:>9.3f} {pub:>8.3f} "
                  f"{first:>8.2f} {all_s:>8.2f} {conv:>8.2f} {lat:>9.2f} {all_s / cn:>10.1f} {all_s / c1:>10.1f}")
    print("req p50 s: median latency of the load's requests during that propagation (a replica counts as "
          "serving only once a request on the new version completed)")
    if len(runs) > 1:
        ref = {row[0]: row[8] for row in runs[0].rows}
        for r in runs[1:]:
            for row in r.rows:
                if row[0] in ref:
                    print(f"{row[0]}: {r.engine} / {runs[0].engine} 'all s' = {row[8]:.2f} / {ref[row[0]]:.2f} = "
                          f"{row[8] / ref[row[0]]:.2f}x")
    for r in runs:
        total, bad = len(r.load.answers), sum(r.load.errors.values())
        failed += bad
        print(f"[{r.engine}] requests during the run: {total} answered, {bad} failed" +
              (f" ({dict(r.load.errors)})" if bad else ""))
    ok = failed == 0 and worst <= TARGET
    print(f"propagation / raw copy to every replica: worst {worst:.1f}x (target <= {TARGET}x); "
          f"failed requests {failed} (target 0): {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
