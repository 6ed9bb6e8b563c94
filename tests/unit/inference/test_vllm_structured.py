"""The vLLM engine's structured-output mapping (services/inference/engines/vllm_engine.py): every Grammar kind
becomes the StructuredOutputsParams field vLLM documents (json / json_object / grammar); no GPU needed."""

from __future__ import annotations

import json

import pytest

from services.inference.engines.vllm_engine import structured_outputs_kwargs
from shared.decoding.params import Grammar


def test_each_grammar_kind_maps_to_its_vllm_field() -> None:
    schema = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}})
    assert structured_outputs_kwargs(None) is None
    assert structured_outputs_kwargs(Grammar("json_schema", schema)) == {"json": schema}
    assert structured_outputs_kwargs(Grammar("json_object")) == {"json_object": True}
    lark = 'start: "<tool_call>" %json{"type": "object"} "</tool_call>"'
    assert structured_outputs_kwargs(Grammar("lark", lark)) == {"grammar": lark}
    with pytest.raises(ValueError, match="unknown grammar kind"):
        structured_outputs_kwargs(Grammar("regex", "a+"))
