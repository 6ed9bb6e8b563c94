"""kill -9 at arbitrary points, restart, repeat: no graded record is lost and none is trained twice.

The trainer runs as a real process (`python -m services.trainer`) against the real broker and the real
Weights service; it is SIGKILLed twice at moments chosen at random around its checkpoints, then left to
finish. The surviving lineage (the chain of checkpoints from LATEST back to the first) must have trained
every usable acme record exactly once, every published version must belong to that chain, and the
versions' data offset ranges must tile the topic without overlap.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from shared.contracts.topics import Topics
from shared.proto.apprentice.v1 import weights_pb2
from tests.helpers.waiting import wait_for
from tests.integration.test_trainer_service import MODEL, produce_traffic, weights  # noqa: F401 - fixture

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def chain(state_dir: Path) -> list[dict]:
    """States of the surviving lineage, oldest first."""
    latest = state_dir / "LATEST"
    if not latest.exists():
        return []
    out, name = [], latest.read_text().strip()
    while name:
        st = json.loads((state_dir / "ckpts" / name / "state.json").read_text())
        out.append(st)
        name = st["parent"]
    return out[::-1]


def latest_id(state_dir: Path) -> str:
    p = state_dir / "LATEST"
    return p.read_text().strip() if p.exists() else ""


def start(env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "services.trainer"], cwd=REPO, env=env,
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT)


def trainer_reaches(cond: Callable[[], bool], what: str, proc: subprocess.Popen, log: Path) -> None:
    """Until `cond`, for as long as the trainer keeps logging (its log's size is the progress); fails at
    once when the trainer exits."""
    def alive_and(cond: Callable[[], bool]) -> bool:
        if cond():
            return True
        if proc.poll() is not None:
            raise AssertionError(f"trainer exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        return False

    wait_for(lambda: alive_and(cond), what=what, stall_s=120, progress=lambda: log.stat().st_size, every=0.1,
             detail=lambda: log.read_text()[-3000:])


def test_kill_9_and_restart_loses_nothing_and_trains_nothing_twice(
        topics: Topics, kafka_bootstrap: str, tmp_path: Path, weights, tiny_model_name: str) -> None:  # noqa: ANN001, F811
    from shared.models import load_tokenizer

    port, stub = weights
    ids = produce_traffic(kafka_bootstrap, topics, load_tokenizer(tiny_model_name), n_groups=5, singles=6, seed=7)
    expected = set(ids["acme"])
    state = tmp_path / "trainer"
    env = {**os.environ, "APPRENTICE_MODEL": MODEL, "APPRENTICE_TRAINER_TENANT": "acme",
           "APPRENTICE_TRAINER_STATE_DIR": str(state), "APPRENTICE_TRAINER_WEIGHTS_ENDPOINT": f"127.0.0.1:{port}",
           "APPRENTICE_TRAINER_METRICS_PORT": "0", "APPRENTICE_TRAINER_TRIGGER_SAMPLES": "4",
           "APPRENTICE_TRAINER_MAX_STALENESS": "1000", "APPRENTICE_TRAINER_DISTILL_ENABLED": "false",
           "APPRENTICE_TRAINER_CHECKPOINT_KEEP": "1000", "APPRENTICE_TRAINER_BATCH_SIZE": "4",
           "APPRENTICE_TRAINER_MICRO_BATCH_SIZE": "4", "APPRENTICE_TRAINER_LR": "1e-3",
           "APPRENTICE_TRAINER_TRIGGER_SECONDS": "1", "APPRENTICE_TRAINER_MIN_SAMPLES": "1",
           "APPRENTICE_TORCH_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    rng = random.Random(1234)
    log = tmp_path / "trainer.log"

    procs: list[subprocess.Popen] = []
    try:
        # run 1: killed shortly after its first checkpoint (during publish or the next round)
        proc = start(env, log)
        procs.append(proc)
        trainer_reaches(lambda: latest_id(state) != "", "the first checkpoint", proc, log)
        time.sleep(rng.uniform(0.0, 1.0))       # the kill lands at a random point of the next round (the test)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        # run 2: killed right after it writes one more checkpoint (before or while publishing it)
        before = latest_id(state)
        proc = start(env, log)
        procs.append(proc)
        trainer_reaches(lambda: latest_id(state) != before, "one more checkpoint", proc, log)
        time.sleep(rng.uniform(0.0, 0.3))       # a random point before or while it publishes (the test)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        # run 3: to completion (every acme record trained, the newest checkpoint published), then SIGTERM
        proc = start(env, log)
        procs.append(proc)

        def done() -> bool:
            trained = [i for st in chain(state) for i in st["trained_ids"]]
            pub = json.loads((state / "published.json").read_text()) if (state / "published.json").exists() else {}
            return set(trained) >= expected and latest_id(state) in pub

        trainer_reaches(done, "every record trained and the last checkpoint published", proc, log)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        for p in procs:                          # never leave a trainer behind when an assertion fails
            if p.poll() is None:
                p.kill()
                p.wait()

    lineage = chain(state)
    trained = Counter(i for st in lineage for i in st["trained_ids"])
    assert set(trained) == expected, "lost or foreign records"
    assert max(trained.values()) == 1, f"trained twice: {[i for i, n in trained.items() if n > 1]}"

    # every published version is a checkpoint of the surviving chain, uploaded once, parents chained
    chain_ids = [st["id"] for st in lineage]
    versions = [m for m in stub.List(weights_pb2.ListVersionsRequest(model=MODEL)).versions if m.version != "base"]
    uploaded = Counter(m.training_metadata["checkpoint_id"] for m in versions)
    assert max(uploaded.values()) == 1 and set(uploaded) <= set(chain_ids)
    by_ckpt = {m.training_metadata["checkpoint_id"]: m for m in versions}
    ordered = [by_ckpt[c] for c in chain_ids if c in by_ckpt]
    assert [m.parent_version for m in ordered] == ["base"] + [m.version for m in ordered[:-1]]
    assert all(m.tenant == "acme" for m in ordered)
    # the versions' data ranges tile each partition from 0 without overlap
    per_partition: dict[int, list[tuple[int, int]]] = {}
    for m in ordered:
        for o in m.data_offsets:
            per_partition.setdefault(o.partition, []).append((o.start_offset, o.end_offset))
    for spans in per_partition.values():
        spans.sort()
        assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
