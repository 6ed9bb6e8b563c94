"""Grammar constraints (shared/decoding/constraints.py) by hand on the tiny model's tokenizer (SmolLM2's):
the mask forbids a wrong token, EOS is refused before the JSON closes, a schema's constrained output
parses, Lark with an embedded `%json{...}` (tool calls) works, bad grammars raise llguidance's message."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from shared.decoding.constraints import GrammarError, allowed_mask, constraint_for, validate
from shared.decoding.params import Grammar

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
          "additionalProperties": False}


@pytest.fixture(scope="module")
def tok(tiny_model_name: str) -> Any:
    from transformers import AutoTokenizer

    from shared.models import resolve_model_dir

    return AutoTokenizer.from_pretrained(resolve_model_dir(tiny_model_name))


def test_mask_by_hand_forbids_wrong_tokens_and_early_eos(tok: Any) -> None:
    c = constraint_for(Grammar("json_schema", json.dumps(SCHEMA)), tok)
    eos = {tok.eos_token_id}
    vocab = len(tok)
    ids = tok.encode('{"a":12}')
    assert [tok.decode([i]) for i in ids] == ['{"', "a", '":', "1", "2", "}"]
    wrong_first = tok.encode("hello")[0]
    for n, i in enumerate(ids):
        m = allowed_mask([c, None], eos, vocab)
        assert bool(m[0, i]), f"token {n} of the valid answer must be allowed"
        assert not bool(m[0, tok.eos_token_id]), "EOS before the object closes"
        assert bool(m[1].all()), "an unconstrained row allows everything"
        if n == 0:
            assert not bool(m[0, wrong_first])
        if n == 3:                        # after '":' a space (compact JSON) and a string are wrong
            assert not bool(m[0, tok.encode(" ")[0]])
            assert not bool(m[0, tok.encode('"')[0]])
        c.consume(i)
    assert c.accepting() and c.finished()
    assert bool(allowed_mask([c], eos, vocab)[0, tok.eos_token_id])


def test_greedy_walk_of_the_mask_gives_a_valid_document(tok: Any) -> None:
    """A deterministic 'model' that closes what it can (a closing token when allowed, else the lowest
    allowed id) still yields JSON that validates against a nested schema with enums, arrays and numbers."""
    schema = {"type": "object", "properties": {
        "kind": {"enum": ["x", "y"]}, "n": {"type": "number"},
        "items": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
        "inner": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                  "additionalProperties": False}},
        "required": ["kind", "n", "items", "inner"], "additionalProperties": False}
    c = constraint_for(Grammar("json_schema", json.dumps(schema)), tok)
    closers = [tok.encode(x)[0] for x in ("}", "]", '"', ",")]
    out: list[int] = []
    for _ in range(200):
        if c.finished():
            break
        m = allowed_mask([c], {tok.eos_token_id}, len(tok))[0]
        m[tok.eos_token_id] = False
        t = next((x for x in closers if bool(m[x])), int(m.nonzero()[0]))
        c.consume(t)
        out.append(t)
    assert c.finished()
    doc = json.loads(tok.decode(out))
    jsonschema.validate(doc, schema)


def test_lark_with_embedded_json_schema_for_tool_calls(tok: Any) -> None:
    lark = ('start: "<tool_call>" call "</tool_call>"\n'
            'call: %json{"type": "object", "properties": {"name": {"const": "get_weather"}, '
            '"arguments": {"type": "object"}}, "required": ["name", "arguments"], "additionalProperties": false}')
    c = constraint_for(Grammar("lark", lark), tok)
    text = '<tool_call>{"name":"get_weather","arguments":{}}</tool_call>'
    for i in tok.encode(text):
        assert bool(allowed_mask([c], {tok.eos_token_id}, len(tok))[0, i])
        c.consume(i)
    assert c.accepting()
    c2 = constraint_for(Grammar("lark", lark), tok)
    bad = tok.encode('<tool_call>{"name":"rm"')
    with pytest.raises(GrammarError):
        for i in bad:
            c2.consume(i)


@pytest.mark.parametrize("grammar, message", [
    (Grammar("lark", "start: foo"), "unknown name"),
    (Grammar("json_schema", '{"type": "objectx"}'), "objectx"),
    (Grammar("json_schema", "{not json"), "not valid JSON"),
    (Grammar("json_schema", "[1]"), "JSON object"),
    (Grammar("regex", "a+"), "unknown grammar kind"),
    (Grammar("json_schema", json.dumps({"description": "x" * 70000})), "larger than"),
])
def test_bad_grammars_raise_a_clear_error(grammar: Grammar, message: str) -> None:
    with pytest.raises(GrammarError, match=message):
        validate(grammar)
