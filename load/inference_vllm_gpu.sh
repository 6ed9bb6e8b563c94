#!/bin/bash
# GPU run of load/inference_vllm_gpu.py (vLLM engine: Generate + one LoRA swap, tokens/s) on a GPU machine
# that has torch 2.11 (CUDA 13) but no vLLM and no network, with at most 64 MiB carried per call:
#   load/inference_vllm_gpu.sh prepare   # here: vLLM 0.26.0 (the release built for torch 2.11 / CUDA 13)
#                                        # without its optional kernels, the Python packages vLLM imports
#                                        # that the machine lacks, SmolLM2's tokenizer + config, split into
#                                        # .vllm-gpu1/ (~56 MB) and .vllm-gpu2/ (~40 MB), git-ignored
#   load/inference_vllm_gpu.sh stage1    # GPU machine, call 1, carry .vllm-gpu1: checks it arrived
#   load/inference_vllm_gpu.sh run       # same machine, call 2 right after (it stays warm ~30 s), carry
#                                        # .vllm-gpu2 (.vllm-gpu1 is still there): install, run; log in $OUT
# What is left out of the vLLM wheel: FlashAttention 2/3 (450 MB; the run uses the TRITON_ATTN backend, and
# vllm_flash_attn's import-time check for them is disabled in the payload), the MoE kernels (dense models
# only) and other Python versions' DeepGEMM builds. See services/inference/README.md.
set -o pipefail
VLLM=0.26.0
case "$1" in
prepare)
  for d in /.vllm-gpu1/ /.vllm-gpu2/; do grep -qxF "$d" .git/info/exclude || echo "$d" >> .git/info/exclude; done
  rm -rf .vllm-gpu1 .vllm-gpu2 && mkdir -p .vllm-gpu1 .vllm-gpu2/whl .vllm-gpu2/models/smollm2-135m-instruct
  work=$(mktemp -d)
  plat="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
        --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 --platform manylinux_2_24_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_31_x86_64
        --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64"
  # shellcheck disable=SC2086
  python3 -m pip download -q --no-deps $plat -d "$work" "vllm==$VLLM" || exit 1
  # vLLM's imports on the engine path that the GPU image lacks (it has torch, transformers, numpy, ...)
  # shellcheck disable=SC2086
  python3 -m pip download -q --no-deps $plat -d .vllm-gpu2/whl msgspec==0.23.0 pybase64==1.5.1 pyzmq==27.3.0 \
    cachetools==8.0.2 cbor2==6.3.0 openai-harmony==0.0.8 "llguidance>=1.7.0,<1.8.0" xgrammar==0.2.9 \
    apache-tvm-ffi==0.1.15.post2 fastapi==0.136.0 starlette==1.10.0 openai==2.54.0 distro==1.9.0 jiter==0.19.0 \
    sniffio==1.3.1 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
    typing-extensions==4.16.0 pydantic-settings==2.16.3 python-dotenv==1.2.4 protobuf==7.36.2 || exit 1
  (cd "$work" && unzip -q vllm-*.whl && rm vllm-*.whl \
    && rm -f vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so \
             vllm/_moe_C_stable_libtorch.abi3.so vllm/third_party/deep_gemm/_C.cpython-31[0134]-*.so) || exit 1
  # On CUDA, vllm_flash_attn refuses to import without an FA extension, and the attention layers import it
  # even when TRITON_ATTN runs (which never calls FA): make that check a no-op in this payload only.
  sed -i 's/^if not (FA2_AVAILABLE or FA3_AVAILABLE):/if False:  # apprentice: FA left out, TRITON_ATTN/' \
    "$work/vllm/vllm_flash_attn/__init__.py" && grep -q "apprentice: FA left out" "$work/vllm/vllm_flash_attn/__init__.py" || exit 1
  xz -9 -T2 -c "$work/vllm/_C_stable_libtorch.abi3.so" > .vllm-gpu1/vllm_C.so.xz || exit 1
  tar -C "$work" -cf - --exclude=vllm/_C_stable_libtorch.abi3.so vllm "vllm-$VLLM.dist-info" \
    | xz -9 -T2 > .vllm-gpu2/vllm_py.tar.xz || exit 1
  rm -rf "$work"
  src=${APPRENTICE_MODEL_CACHE:-$HOME/.cache/apprentice/models}/smollm2-135m-instruct
  [ -f "$src/tokenizer.json" ] || .venv/bin/python -c "from shared.models import load_tokenizer; load_tokenizer('smollm2-135m-instruct')"
  cp "$src"/{chat_template.jinja,config.json,generation_config.json,tokenizer.json,tokenizer_config.json} \
    .vllm-gpu2/models/smollm2-135m-instruct/
  du -sh .vllm-gpu1 .vllm-gpu2 ;;
stage1)
  ls -la .vllm-gpu1 && nvidia-smi -L && python3 -V ;;
run)
  [ -f .vllm-gpu1/vllm_C.so.xz ] || { echo "no .vllm-gpu1/vllm_C.so.xz: run 'stage1' on this warm machine first"; exit 3; }
  t0=$(date +%s)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .vllm-gpu2/whl/*.whl || exit 1
  # Python's lzma, not the xz program, which a bare image may lack
  python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='tar')" \
    .vllm-gpu2/vllm_py.tar.xz /tmp/site || exit 1
  python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
    .vllm-gpu1/vllm_C.so.xz /tmp/site/vllm/_C_stable_libtorch.abi3.so || exit 1
  echo "installed in $(( $(date +%s) - t0 )) s"
  export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 VLLM_USE_DEEP_GEMM=0 VLLM_USE_FLASHINFER_SAMPLER=0 \
    APPRENTICE_HOME=/tmp/apprentice OUT=${OUT:-/tmp}
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  timeout 120 python3 -c "import torch, vllm, vllm._C_stable_libtorch; from vllm.v1.engine.async_llm import AsyncLLM; \
print('vllm', vllm.__version__, 'torch', torch.__version__, torch.cuda.get_device_name())" 2>&1 | grep -v "^INFO" || exit 1
  model=random:.vllm-gpu2/models/smollm2-135m-instruct
  timeout "${EAGER_S:-300}" python3 load/inference_vllm_gpu.py --model $model --eager --attention-backend TRITON_ATTN \
    --full-swap --json "$OUT/vllm_gpu_eager.json" 2>&1 | tee "$OUT/vllm_gpu_eager.log" | grep -v -E "it/s\]|s/it\]"
  rc=$?
  # With torch.compile + CUDA graphs (vLLM's default serving mode), when the eager run got as far as its results.
  [ -f "$OUT/vllm_gpu_eager.json" ] && timeout "${GRAPH_S:-200}" python3 load/inference_vllm_gpu.py --model $model \
    --attention-backend TRITON_ATTN --json "$OUT/vllm_gpu_graphs.json" 2>&1 | tee "$OUT/vllm_gpu_graphs.log" \
    | grep -v -E "it/s\]|s/it\]"
  exit $rc ;;
*) echo "usage: $0 prepare|stage1|run" >&2; exit 2 ;;
esac
