"""Test fixtures shared by the whole suite.

The broker is real: `kafka_bootstrap` starts the local KRaft broker through the project's own tooling
(`LocalBroker`, the same code as `apprentice kafka start`) unless one already answers. Each test that
needs topics gets its own namespace (`topics` fixture), so tests never see each other's records.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.contracts.topics import Topics

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """The local broker (started, reused, or restarted when it still runs the configuration from before
    authorization), with this process and its subprocesses as its admin (super user): the suite's own
    set-up (topics, reading any topic) needs it; stacks give each service its own principal
    (tools/stack/stack.py). A broker of the user's own, with credentials set in the environment, is used
    as configured; a broker on the port that refuses this home's admin stops the session with why."""
    from shared.contracts.topic_access import ADMIN
    from shared.kafka.admin import broker_answers
    from tools.broker.local_broker import BrokerError, LocalBroker, local_credentials_dir

    bootstrap = os.environ.get("APPRENTICE_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    if os.environ.get("APPRENTICE_KAFKA_SECURITY_PROTOCOL") and local_credentials_dir(os.environ) is None:
        if not broker_answers(bootstrap, timeout=10.0):
            pytest.exit(f"kafka_bootstrap: the configured broker at {bootstrap} does not accept the configured "
                        "credentials", returncode=3)
        yield bootstrap
        return
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    broker = LocalBroker(Path(os.environ.get("APPRENTICE_HOME", REPO / ".apprentice")), host=host or "127.0.0.1",
                         port=int(port), controller_port=int(port) + 1)
    before = broker.status()
    started = not (before.running or before.refuses_admin)   # nothing listened: this session starts it
    try:
        status = broker.start()
    except BrokerError as e:
        pytest.exit(f"kafka_bootstrap: {e}", returncode=3)
    os.environ.pop("APPRENTICE_KAFKA_SASL_PASSWORD", None)
    os.environ.update(broker.client_env(ADMIN))
    yield status.bootstrap
    if started and not os.environ.get("APPRENTICE_TEST_KEEP_BROKER"):
        broker.stop()


@pytest.fixture
def topics(kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Topics]:
    """A fresh namespace of all eight topics; settings built inside the test see it via the environment."""
    from shared.kafka.admin import delete_topics, ensure_topics

    t = Topics(prefix=f"test-{uuid.uuid4().hex[:10]}.")
    ensure_topics(kafka_bootstrap, t)
    monkeypatch.setenv("APPRENTICE_TOPIC_PREFIX", t.prefix)
    monkeypatch.setenv("APPRENTICE_KAFKA_BOOTSTRAP", kafka_bootstrap)
    yield t
    delete_topics(kafka_bootstrap, [s.name for s in t.specs()])


@pytest.fixture(scope="session")
def tiny_model_name() -> str:
    """The tiny random Llama (3.2 M parameters, SmolLM2 tokenizer), cached on first use."""
    from shared.models import TINY, resolve_model_dir

    resolve_model_dir(TINY)
    return TINY


@pytest.fixture(scope="session")
def tiny_vllm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's tiny random Llama with 2 heads of 32 (vLLM's CPU attention has no head size 16): the model
    the engine contract runs on both engines (tests/integration/test_engine_contract.py, test_engine_doors.py)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from shared.models import SMOLLM2, _set_chatml_eos, load_tokenizer

    tok = load_tokenizer(SMOLLM2)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                         tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    _set_chatml_eos(model, tok)
    out = tmp_path_factory.mktemp("tiny-vllm")
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


@pytest.fixture
def tmp_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("APPRENTICE_HOME", str(tmp_path))
    return tmp_path
