"""Grammar constraints (shared/decoding/constraints.py) by hand on the tiny model's tokenizer (SmolLM2's):
the mask forbids a wrong token, EOS is refused before the JSON closes, a schema's constrained output
parses, Lark with an embedded `%json{...}` (tool calls) works, bad grammars raise llguidance's message."""

from __future__ import annotations

import functools
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


@pytest.fixture(scope="module")
def tiny(tiny_model_name: str) -> tuple[Any, Any]:
    from shared.models import load_model

    return load_model(tiny_model_name)


def test_decode_loop_mixes_constrained_and_free_rows(tiny: tuple[Any, Any]) -> None:
    """The random tiny model never writes JSON by itself; under the mask every constrained row (greedy and
    sampled, in one batch with a free row) ends with a document its schema validates, finish 'stop'. The
    temperature-1 log-probs stay the unmasked model's (teacher-forced), the behaviour ones are the masked
    distribution's (> the unmasked log-prob where the mask removed mass)."""
    from shared.decoding.batch import decode_batch
    from shared.decoding.generation import encode_prompt, render_chat
    from shared.decoding.logprobs import sequence_logprobs
    from shared.decoding.params import Sample, SamplingConfig
    from shared.decoding.rows import DecodeRow

    model, tok = tiny
    schema = {"type": "object", "properties": {"kind": {"enum": ["bug", "feature"]},
                                               "tags": {"type": "array", "items": {"type": "boolean"},
                                                        "maxItems": 3}},
              "required": ["kind", "tags"], "additionalProperties": False}
    g = Grammar("json_schema", json.dumps(schema))
    prompt = encode_prompt(tok, render_chat(tok, [{"role": "user", "content": "classify"}]))
    cfgs = [SamplingConfig(max_new_tokens=60, grammar=g),
            SamplingConfig(max_new_tokens=60, temperature=1.0, seed=3, grammar=g),
            SamplingConfig(max_new_tokens=8, temperature=0.7, top_k=50, seed=4),
            SamplingConfig(max_new_tokens=60, temperature=0.9, top_p=0.95, seed=5, grammar=g)]
    out: dict[int, Sample] = {}
    rows = [DecodeRow(prompt, c, on_finish=functools.partial(out.__setitem__, i)) for i, c in enumerate(cfgs)]
    decode_batch(model, tok, rows)
    for i in (0, 1, 3):
        s = out[i]
        assert s.finish_reason == "stop", s.text
        jsonschema.validate(json.loads(s.text), schema)
        ref = sequence_logprobs(model, prompt, s.token_ids)
        assert ref.tolist() == pytest.approx(s.logprobs_t1, abs=1e-4)
    sampled = out[1]
    assert all(b >= t - 1e-5 for b, t in zip(sampled.logprobs, sampled.logprobs_t1, strict=True))
    assert any(b > t + 1e-3 for b, t in zip(sampled.logprobs, sampled.logprobs_t1, strict=True))
    assert len(out[2].token_ids) == 8


@pytest.mark.slow
def test_smollm2_answers_a_schema_it_is_asked_for() -> None:
    """The real SmolLM2-135M-Instruct, greedy and sampled, under a schema: every answer validates."""
    from shared.decoding.batch import decode_batch
    from shared.decoding.generation import encode_prompt, render_chat
    from shared.decoding.params import Sample, SamplingConfig
    from shared.decoding.rows import DecodeRow
    from shared.models import SMOLLM2, load_model

    model, tok = load_model(SMOLLM2)
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "country": {"type": "string", "maxLength": 20},
                                               "population_millions": {"type": "integer", "minimum": 0,
                                                                       "maximum": 100000}},
              "required": ["city", "country", "population_millions"], "additionalProperties": False}
    prompt = encode_prompt(tok, render_chat(tok, [{"role": "user", "content":
                                                   "Name a large city as JSON with city, country and population."}]))
    g = Grammar("json_schema", json.dumps(schema))
    out: dict[int, Sample] = {}
    cfgs = [SamplingConfig(max_new_tokens=80, grammar=g),
            SamplingConfig(max_new_tokens=80, temperature=0.7, seed=1, grammar=g)]
    decode_batch(model, tok, [DecodeRow(prompt, c, on_finish=functools.partial(out.__setitem__, i))
                              for i, c in enumerate(cfgs)])
    for s in out.values():
        assert s.finish_reason == "stop", s.text
        jsonschema.validate(json.loads(s.text), schema)
