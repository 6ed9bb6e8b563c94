"""A causal LM --> the forward-pass keywords that make it compute the last position's logits only.

A decode step reads only the last position's logits, but a plain forward pass projects every position
onto the vocabulary: at prefill that is rows x prompt tokens x vocabulary logits (49,152 for SmolLM2;
300 MB for the eval gate's default sets in one batch), computed and thrown away, and on a small model
it costs more than the transformer itself. Hugging Face models take `logits_to_keep=1`
(`num_logits_to_keep` before transformers 4.50); a PEFT wrapper forwards it to its base model.
"""

from __future__ import annotations

import inspect
from typing import Any

_NAMES = ("logits_to_keep", "num_logits_to_keep")


def last_position_only(model: Any) -> dict[str, int]:
    """{name: 1} for the keyword `model`'s forward accepts, {} when it takes neither (the full logits are
    then computed and the last position read)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        params = inspect.signature(inner.forward).parameters
    except (TypeError, ValueError):
        return {}
    return next(({name: 1} for name in _NAMES if name in params), {})
