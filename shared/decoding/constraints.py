"""Grammar-constrained decoding: a `Grammar` (shared/decoding/params.py) compiled with llguidance against
the model's Hugging Face tokenizer, and one `Constraint` (an llguidance matcher) per sample.

At each step the decode loop (shared/decoding/batch.py) asks every constrained row for its allowed-token
mask (`allowed`), masks the logits with it, draws, and feeds the drawn token back (`consume`). EOS is
allowed only where the grammar accepts (a JSON object cannot end before its closing brace), and a sample
ends as soon as the grammar is finished (`finished`), without spending a forward pass on EOS.

Why llguidance (docs/agents.md, "Structured output"): the mask is computed lazily per step from an Earley
parser over the tokenizer's trie, so a new schema has no ahead-of-time compile wait; Lark grammars may
embed JSON schemas (`%json{...}`), which is what tool calls need (`<tool_call>` + JSON + `</tool_call>`).

Costs: building the llguidance tokenizer takes about a second, so it is cached per HF tokenizer; grammars
are compiled to llguidance's serialized form once per (kind, source, tenant) in a bounded LRU cache.

Errors: a bad grammar or schema raises `GrammarError` with llguidance's message; the request layers turn it
into gRPC INVALID_ARGUMENT / HTTP 400 (services/inference/requests.py `check_grammar`).
"""

from __future__ import annotations

import copy
import json
import threading
import weakref
from collections import OrderedDict
from typing import Any

import llguidance
import llguidance.torch
import torch
from tokenizers import decoders, pre_tokenizers

from shared.decoding.params import Grammar

__all__ = ["Constraint", "GrammarError", "compile_grammar", "validate", "constraint_for", "allowed_mask",
           "KINDS", "MAX_SOURCE_BYTES"]

KINDS = ("json_schema", "json_object", "lark")
MAX_SOURCE_BYTES = 64 * 1024     # a schema or grammar larger than this is refused (request-size bound)
_CACHE_SIZE = 256                # compiled grammars kept (serialized llguidance grammars: small strings)

# Any JSON object: the OpenAI `json_object` response format.
_JSON_OBJECT_SCHEMA = '{"type": "object"}'


class GrammarError(ValueError):
    """A grammar or schema llguidance cannot compile (the message is llguidance's), or one refused before
    compiling (unknown kind, too large, schema not a JSON object)."""


_lock = threading.Lock()
_compiled: OrderedDict[tuple[str, str, str], str] = OrderedDict()
_tokenizers: weakref.WeakKeyDictionary[Any, llguidance.LLTokenizer] = weakref.WeakKeyDictionary()
_tokenizers_by_id: dict[int, tuple[Any, llguidance.LLTokenizer]] = {}   # tokenizers that refuse weakrefs


def compile_grammar(grammar: Grammar) -> str:
    """`grammar` as llguidance's serialized grammar, validated (no tokenizer needed), cached by (kind, source,
    scope): the scope is the tenant, so a cache hit never tells one tenant what another sent. Raises GrammarError."""
    key = (grammar.kind, grammar.source, grammar.scope)
    with _lock:
        hit = _compiled.get(key)
        if hit is not None:
            _compiled.move_to_end(key)
            return hit
    if grammar.kind not in KINDS:
        raise GrammarError(f"unknown grammar kind {grammar.kind!r} (one of {', '.join(KINDS)})")
    if len(grammar.source.encode()) > MAX_SOURCE_BYTES:
        raise GrammarError(f"grammar source larger than {MAX_SOURCE_BYTES} bytes")
    if grammar.kind == "lark":
        serialized = llguidance.LLMatcher.grammar_from_lark(grammar.source)
    else:
        source = grammar.source if grammar.kind == "json_schema" else _JSON_OBJECT_SCHEMA
        try:
            schema = json.loads(source)
        except ValueError as e:
            raise GrammarError(f"schema is not valid JSON: {e}") from None
        if not isinstance(schema, dict):
            raise GrammarError("schema must be a JSON object")
        try:
            serialized = llguidance.LLMatcher.grammar_from_json_schema(
                schema, defaults={"whitespace_flexible": False})
        except ValueError as e:
            raise GrammarError(str(e)) from None
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(serialized)
    if is_error:
        raise GrammarError(messages[0] if messages else "invalid grammar")
    with _lock:
        _compiled[key] = serialized
        while len(_compiled) > _CACHE_SIZE:
            _compiled.popitem(last=False)
    return serialized


def validate(grammar: Grammar) -> None:
    """Raise GrammarError if `grammar` cannot be compiled (request-time check, no model needed)."""
    compile_grammar(grammar)


def _ll_tokenizer(tok: Any) -> llguidance.LLTokenizer:
    """The llguidance tokenizer of HF tokenizer `tok`, built once (about a second) and cached."""
    with _lock:
        try:
            hit = _tokenizers.get(tok)
        except TypeError:
            entry = _tokenizers_by_id.get(id(tok))
            hit = entry[1] if entry is not None and entry[0] is tok else None
        if hit is not None:
            return hit
    ll = _build_ll_tokenizer(tok)
    with _lock:
        try:
            _tokenizers[tok] = ll
        except TypeError:
            _tokenizers_by_id[id(tok)] = (tok, ll)
    return ll


def _build_ll_tokenizer(tok: Any) -> llguidance.LLTokenizer:
    """llguidance.hf.from_tokenizer, except that a byte-level BPE whose decoder is a Sequence (transformers 5
    writes ByteFallback + Fuse + Replace + ByteLevel for SmolLM2's tokenizer) gets a plain ByteLevel decoder:
    llguidance recognises byte-level vocabularies by their decoder, and without this it reads token
    "\u0120" (a space) as the two bytes of "\u0120", so the mask forbids every space."""
    backend = copy.copy(tok.backend_tokenizer)
    if isinstance(backend.pre_tokenizer, pre_tokenizers.ByteLevel) and not isinstance(backend.decoder,
                                                                                        decoders.ByteLevel):
        backend.decoder = decoders.ByteLevel()
    backend.no_padding()
    backend.no_truncation()
    return llguidance.LLTokenizer(backend.to_str(), eos_token=tok.eos_token_id)


class Constraint:
    """One sample's grammar state: the llguidance matcher over the tokens drawn so far."""

    def __init__(self, ll_tok: llguidance.LLTokenizer, serialized: str) -> None:
        self.matcher = llguidance.LLMatcher(ll_tok, serialized, log_level=0)
        if self.matcher.is_error():
            raise GrammarError(self.matcher.get_error())
        self.vocab_size = ll_tok.vocab_size
        self.words = (self.vocab_size + 31) // 32

    def fill(self, bitmask: torch.Tensor, index: int) -> None:
        """Write this sample's allowed tokens into row `index` of an int32 (B, words) CPU bitmask."""
        llguidance.torch.fill_next_token_bitmask(self.matcher, bitmask, index)

    def accepting(self) -> bool:
        """Whether the text so far is a complete sentence of the grammar (EOS may come now)."""
        return bool(self.matcher.is_accepting())

    def finished(self) -> bool:
        """Whether the grammar allows nothing more: the sample ends here."""
        return bool(self.matcher.is_stopped())

    def consume(self, token: int) -> None:
        """Advance past the drawn token (which the mask allowed). A matcher error is a bug: raise."""
        if not self.matcher.consume_token(token):
            raise GrammarError(f"token {token} refused by the grammar: {self.matcher.get_error()}")


def constraint_for(grammar: Grammar, tok: Any) -> Constraint:
    """A fresh matcher of `grammar` for one sample of HF tokenizer `tok`. Raises GrammarError."""
    return Constraint(_ll_tokenizer(tok), compile_grammar(grammar))


_BITS = torch.arange(32, dtype=torch.int32)


def allowed_mask(constraints: list[Constraint | None], eos_ids: set[int], vocab: int,
                 device: torch.device | str = "cpu") -> torch.Tensor:
    """(B, vocab) bool: which tokens each row may draw next; an unconstrained row (None) allows all.

    llguidance fills a packed int32 bitmask (one call per constrained row, in Rust, about tens of
    microseconds); it is unpacked in one vectorised pass. Every id in `eos_ids` (the model's EOS set, which
    may hold more than llguidance's one EOS) is allowed exactly where the grammar accepts. Columns beyond
    the tokenizer's vocabulary (padded embedding rows) are never allowed in a constrained row."""
    B = len(constraints)
    first = next(c for c in constraints if c is not None)
    words = first.words
    bitmask = torch.full((B, words), -1, dtype=torch.int32)
    for i, c in enumerate(constraints):
        if c is not None:
            c.fill(bitmask, i)
    bits = ((bitmask.unsqueeze(-1) >> _BITS) & 1).bool().reshape(B, words * 32)
    if bits.shape[1] >= vocab:
        mask = bits[:, :vocab].clone()
    else:
        mask = torch.zeros((B, vocab), dtype=torch.bool)
        mask[:, :bits.shape[1]] = bits
    eos = [e for e in eos_ids if e < vocab]
    for i, c in enumerate(constraints):
        if c is None:
            mask[i] = True
        elif eos:
            mask[i, eos] = c.accepting()
    return mask.to(device)
