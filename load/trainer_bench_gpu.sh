#!/bin/bash
# GPU run of load/trainer_bench.py (TRL GRPOTrainer vs Apprentice; distillation step), used on the H200.
#   load/trainer_bench_gpu.sh prepare   # here: wheels (trl, datasets, ... for Python 3.12) + tokenizer/configs
#                                       # into .trainer-gpu/ (git-ignored via .git/info/exclude)
#   load/trainer_bench_gpu.sh run       # on the GPU machine, with .trainer-gpu carried; results in $OUT
set -o pipefail
case "$1" in
prepare)
  grep -q "^/.trainer-gpu/" .git/info/exclude || echo "/.trainer-gpu/" >> .git/info/exclude
  mkdir -p .trainer-gpu/whl .trainer-gpu/models/smollm2-135m-instruct
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .trainer-gpu/whl trl==1.16.0 datasets==5.0.1 dill==0.4.1 multiprocess==0.70.19 protobuf==7.36.2
  src=${APPRENTICE_MODEL_CACHE:-$HOME/.cache/apprentice/models}
  cp -r "$src/tiny-random" .trainer-gpu/models/
  cp "$src"/smollm2-135m-instruct/{chat_template.jinja,config.json,generation_config.json,tokenizer.json,tokenizer_config.json} \
    .trainer-gpu/models/smollm2-135m-instruct/ ;;
run)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .trainer-gpu/whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD APPRENTICE_MODEL_CACHE=$PWD/.trainer-gpu/models PYTHONUNBUFFERED=1
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  # SmolLM2-135M's architecture with random weights (its 540 MB of weights cannot travel; speed does not depend on them)
  timeout 300 python3 load/trainer_bench.py --model random:.trainer-gpu/models/smollm2-135m-instruct --device cuda \
    --prompts 8 --group 8 --prompt-len 128 --completion-len 512 --reps 5 2>&1 | grep -v "Loading" | tee "${OUT:-.}/bench_smollm2_gpu.txt"
  timeout 150 python3 load/trainer_bench.py --model tiny-random --device cuda \
    --prompts 8 --group 8 --prompt-len 128 --completion-len 512 --reps 5 2>&1 | grep -v "Loading" | tee "${OUT:-.}/bench_tiny_gpu.txt" ;;
*) echo "usage: $0 prepare|run" >&2; exit 2 ;;
esac
