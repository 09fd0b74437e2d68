#!/usr/bin/env bash
# Issue 30 on one H200: sync on-policy, one-step off-policy and streaming rollouts (rollout.in_flight at
# 1.5x, 2x and 3x the batch) with the 270M pipeline (experiments/async_lora_ray/run_async_lora_ray.sh's warm start
# and PPO settings) against the simulated pool at realistic latency (x1). Two phases, each one device call
# of at most ~8 minutes (RUN_S of training per run, three runs, plus the warm start on a fresh machine):
#
#   bash experiments/streaming/run_streaming.sh a   # carry .whl: warm start, sync, off-policy, streaming 2x
#   bash experiments/streaming/run_streaming.sh b   # carry .whl: streaming 1.5x and 3x, sync again (its noise)
#   python -m experiments.streaming.summarize <the two phases' results, unpacked side by side>
#
# Results: $OUT/<phase>.txt (the log) and $OUT/<phase>.tgz (metrics per run, the pool log). Steps per hour,
# samples/s and tokens/s/GPU come from the metrics (experiments/streaming/summarize.py). .whl holds the wheels
# the device image lacks (hydra-core, omegaconf, antlr4, openai and its pydantic stack).
# A smoke run on CPU: DEVICE=cpu MODEL='{...tiny...}' N_ORACLE=100 SFT_EPOCHS=1 BATCH=8 RUN_S=20 WORK=/tmp/smoke
set -uo pipefail
cd "$(dirname "$0")/../.."
PHASE=${1:?a | b}
BACK=${OUT:-outputs/h200_streaming}
W=${WORK:-/tmp/wave}
RES=$W/results/$PHASE
mkdir -p "$RES" "$BACK"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PY=${PY:-python3}
exec > >(tee "$BACK/$PHASE.txt") 2>&1
DEVICE=${DEVICE:-cuda} N_ORACLE=${N_ORACLE:-2000} SFT_EPOCHS=${SFT_EPOCHS:-3} BATCH=${BATCH:-64} RUN_S=${RUN_S:-80}
MODEL=${MODEL:-'{"model_type": "llama", "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 4, "max_position_embeddings": 2048, "tie_word_embeddings": true, "rope_theta": 10000.0}'}
start=$(date +%s)
source experiments/gemma_h200/sim_warm_start.sh
stage() { echo; echo "== [$(( $(date +%s) - start ))s] $*"; }

stage "wheels"
if [ -d .whl ] && [ ! -f /tmp/site/.ok ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && touch /tmp/site/.ok
fi
export PYTHONPATH=/tmp/site:$PWD
# openai 3.57 imports httpx2, which the device image lacks: the same API as its httpx
$PY -c "import httpx2" 2>/dev/null || { mkdir -p /tmp/site; echo 'import sys, httpx; sys.modules["httpx2"] = httpx' > /tmp/site/httpx2.py; }
[ "$DEVICE" = cpu ] || nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"

stage "warm start (skipped when $W/sft exists)"
if [ ! -f "$W/sft/config.json" ]; then
  sim_warm_start || exit 1
fi

source tools/sim_pool.sh
start_sim_pool "$RES/pool_server.log" --latency-scale 1 --world-entities 150
# run_async_lora_ray.sh's PPO settings (batch 64, hf_static, GAE + critic, alpha 0.6); no validation or
# saving inside the timed steps; the last step validates on 32 rows and is saved (trainer.time_limit_s stops
# the run after RUN_S)
PPO_COMMON=(--config-name embedded "data.train_files=[$W/data/train.parquet]" "data.val_files=[$W/data/val.parquet]"
  data.train_batch_size=$BATCH data.val_batch_size=200 data.val_limit=32 "model.path=$W/sft" "model.tokenizer=$W/sft" model.dtype=auto
  trainer.device=$DEVICE rollout.name=hf_static actor.lr=2e-5
  actor.ppo_mini_batch_size=$((BATCH / 2)) actor.ppo_micro_batch_size=$((BATCH / 2)) critic.lr=1e-4
  critic.ppo_mini_batch_size=$((BATCH / 2)) critic.ppo_micro_batch_size=$((BATCH / 2)) env.alpha=0.6
  trainer.test_freq=0 trainer.val_before_train=false trainer.export_hf=false trainer.resume=none trainer.save_freq=0
  trainer.max_checkpoints=1 trainer.total_steps=200 trainer.time_limit_s=$RUN_S "env.pool_url=$URL")
ppo() {  # $1 = run name, then extra overrides
  local name=$1; shift
  stage "PPO $name"
  timeout $((RUN_S + 60)) $PY -m verl.trainer.main_ppo "${PPO_COMMON[@]}" \
    "trainer.output_dir=$W/$PHASE/$name" "trainer.experiment_name=$name" "$@" > "$RES/$name.log" 2>&1
  echo "rc $? ($name)"; tail -4 "$RES/$name.log"
  cp "$W/$PHASE/$name/metrics.jsonl" "$RES/${name}_metrics.jsonl" 2>/dev/null
}
# slots: 2x the batch (the earlier records' setting) or the streaming run's episodes in play, whichever is more
stream() {  # $1 = run name, $2 = in-flight prompts
  ppo "$1" rollout.in_flight=$2 trainer.max_staleness=${MAX_STALENESS:-1} \
    rollout.max_batch_size=$(( $2 > 2 * BATCH ? $2 : 2 * BATCH ))
}

case $PHASE in
a)
  ppo sync trainer.off_policy_steps=0 rollout.max_batch_size=$((BATCH * 2))
  ppo offpolicy trainer.off_policy_steps=1 rollout.max_batch_size=$((BATCH * 2))
  stream stream2x $((BATCH * 2))
  ;;
b)
  stream stream1.5x $((BATCH * 3 / 2))
  stream stream3x $((BATCH * 3))
  ppo sync trainer.off_policy_steps=0 rollout.max_batch_size=$((BATCH * 2))
  ;;
esac
stage "summary of this phase"
$PY -m experiments.streaming.summarize "$W/results" || true
stage "pack"
[ "$DEVICE" = cpu ] || nvidia-smi --query-gpu=memory.used --format=csv,noheader
tar czf "$BACK/$PHASE.tgz" -C "$W/results" "$PHASE" && ls -la "$BACK/$PHASE.tgz"
