#!/usr/bin/env bash
# The H200 runs of issues 18 (rollout schedules, one-step off-policy), 22 (LoRA vs full PPO) and 23
# (Ray's overhead per step), in three phases over consecutive device calls to one warm machine. Each
# phase rebuilds the warm start if the machine is fresh. Results: $OUT/<phase>.txt (the log) and
# $OUT/<phase>.tgz (metrics, summaries, plots).
#
#   bash experiments/async_lora_ray/run_async_lora_ray.sh warm   # carry .whl .rayA: warm start, slot check, schedules
#   bash experiments/async_lora_ray/run_async_lora_ray.sh ppo    # carry .whl .rayB: on-policy, off-policy, LoRA PPO
#   (each half of the Ray wheel may come with any call to the same warm machine; ray installs once both are there)
#   bash experiments/async_lora_ray/run_async_lora_ray.sh ray    # carry .whl: the same PPO without and with Ray
#   bash experiments/async_lora_ray/run_async_lora_ray.sh streams   # carry .whl: on- vs off-policy once the engine
#                                                          # decodes on its own CUDA stream (a later fix)
#
# .whl holds the wheels the device image lacks (hydra-core, omegaconf, antlr4, openai and its pydantic
# stack, jsonschema's stack for Ray); .rayA/.rayB the two halves of ray-2.60.0 cp312 (79 MB: over one
# call's carry). The policy: the pipeline's 270M Llama built from a config, SFT on 2,000 noisy oracle
# trajectories (experiments/gemma_h200/pipeline_gpu.sh run 1's settings), alpha 0.6 so that the cost term gives PPO
# something to learn at this size (docs/results/h200/README.md: this model learns routing, not EM).
set -uo pipefail
cd "$(dirname "$0")/../.."
PHASE=${1:?warm | ppo | ray | streams}
BACK=${OUT:-outputs/h200_wave}  # what comes back: $BACK/$PHASE.txt and $BACK/$PHASE.tgz
W=${WORK:-/tmp/wave}
RES=$W/results/$PHASE
mkdir -p "$RES" "$BACK"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PY=python3
exec > >(tee "$BACK/$PHASE.txt") 2>&1
# a smoke run on CPU: DEVICE=cpu MODEL='{...tiny...}' N_ORACLE=100 SFT_EPOCHS=1 STEPS=2 BATCH=8 BENCH_BATCH=8 WORK=/tmp/smoke
DEVICE=${DEVICE:-cuda} N_ORACLE=${N_ORACLE:-2000} SFT_EPOCHS=${SFT_EPOCHS:-3} STEPS=${STEPS:-24} BATCH=${BATCH:-64}
BENCH_BATCH=${BENCH_BATCH:-128}
MODEL=${MODEL:-'{"model_type": "llama", "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 4, "max_position_embeddings": 2048, "tie_word_embeddings": true, "rope_theta": 10000.0}'}
echo "$MODEL" > "$W/model.json"  # tools/check/check_slot_rollout.py takes a file
start=$(date +%s)
source experiments/gemma_h200/sim_warm_start.sh
stage() { echo; echo "== [$(( $(date +%s) - start ))s] $*"; }

stage "wheels"
if [ ! -f /tmp/site/.ok ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && touch /tmp/site/.ok
fi
export PYTHONPATH=/tmp/site:$PWD
# openai 3.57 imports httpx2, which the device image lacks: the same API as its httpx
python3 -c "import httpx2" 2>/dev/null || echo 'import sys, httpx; sys.modules["httpx2"] = httpx' > /tmp/site/httpx2.py
mkdir -p /tmp/raypieces && cp .rayA/* .rayB/* /tmp/raypieces/ 2>/dev/null
if [ ! -d /tmp/site/ray ] && [ -f /tmp/raypieces/part0 ] && [ -f /tmp/raypieces/part1 ]; then
  RAYW=/tmp/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
  cat /tmp/raypieces/part0 /tmp/raypieces/part1 > $RAYW
  echo "b951b40965947a63615830916be04f26440d234de1e9a29dbf2155d03fa9ad2a  $RAYW" | sha256sum -c \
    && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $RAYW
fi
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"

stage "warm start (skipped when $W/sft exists)"
if [ ! -f "$W/sft/config.json" ]; then
  sim_warm_start || exit 1
  cp "$W/sft/metrics.jsonl" "$RES/sft_metrics.jsonl"
fi

source tools/sim_pool.sh
# the PPO settings of experiments/gemma_h200/pipeline_gpu.sh (batch 64), alpha 0.6; the step count is the phase's
PPO_COMMON=(--config-name embedded "data.train_files=[$W/data/train.parquet]" "data.val_files=[$W/data/val.parquet]"
  data.train_batch_size=$BATCH data.val_batch_size=200 "model.path=$W/sft" "model.tokenizer=$W/sft" model.dtype=auto
  trainer.device=$DEVICE rollout.name=hf_static rollout.max_batch_size=$((BATCH * 2)) actor.lr=2e-5
  actor.ppo_mini_batch_size=$((BATCH / 2)) actor.ppo_micro_batch_size=$((BATCH / 2)) critic.lr=1e-4
  critic.ppo_mini_batch_size=$((BATCH / 2)) critic.ppo_micro_batch_size=$((BATCH / 2)) env.alpha=0.6 trainer.test_freq=0 trainer.val_before_train=false
  trainer.export_hf=false trainer.resume=none trainer.save_freq=0 trainer.max_checkpoints=1)
ppo() {  # $1 = run name, $2 = seconds at most, then extra overrides
  local name=$1 limit=$2; shift 2
  stage "PPO $name"
  timeout "$limit" $PY -m verl.trainer.main_ppo "${PPO_COMMON[@]}" "env.pool_url=$URL" \
    "trainer.output_dir=$W/$PHASE/$name" "trainer.experiment_name=$name" "$@" > "$RES/$name.log" 2>&1
  echo "rc $? ($name)"; tail -4 "$RES/$name.log"
  cp "$W/$PHASE/$name/metrics.jsonl" "$RES/${name}_metrics.jsonl" 2>/dev/null
}

case $PHASE in
warm)
  stage "slot path vs batch path (float32 random init, then the bf16 SFT policy)"
  timeout 120 $PY -m tools.check.check_slot_rollout --model "$W/model.json" --tokenizer tiny --dtype float32 --n 64 --slots 32 --device "$DEVICE" \
    | tee "$RES/check_slot_fp32.txt"
  timeout 120 $PY -m tools.check.check_slot_rollout --model "$W/sft" --dtype bfloat16 --n 128 --slots 64 --device "$DEVICE" \
    | tee "$RES/check_slot_bf16.txt"
  stage "schedules side by side, hf_static decoding the SFT policy, pool latency x2"
  timeout 330 $PY -m tools.bench.bench_rollout_schedule --model "$W/sft" --device "$DEVICE" --batch "$BENCH_BATCH" --repeats 2 \
    --response-length 256 --max-obs-length 128 | tee "$RES/bench_schedule_b128.txt"
  ;;
ppo)
  start_sim_pool "$RES/pool_server.log" --latency-scale 1 --world-entities 150
  ppo onpolicy 170 trainer.total_steps=$STEPS trainer.off_policy_steps=0
  ppo offpolicy 170 trainer.total_steps=$STEPS trainer.off_policy_steps=1
  ppo lora 170 trainer.total_steps=$STEPS trainer.off_policy_steps=0 actor.lora.rank=64 actor.lora.alpha=128 actor.lr=2e-4
  ;;
streams)  # after the engine got its own CUDA stream: on- vs off-policy again, shorter
  timeout 120 $PY -m tools.check.check_slot_rollout --model "$W/model.json" --tokenizer tiny --dtype float32 --n 64 --slots 32 --device "$DEVICE" \
    | tee "$RES/check_slot_fp32.txt"
  start_sim_pool "$RES/pool_server.log" --latency-scale 1 --world-entities 150
  ppo onpolicy 125 trainer.total_steps=$STEPS trainer.off_policy_steps=0
  ppo offpolicy 125 trainer.total_steps=$STEPS trainer.off_policy_steps=1
  ;;
ray)
  start_sim_pool "$RES/pool_server.log" --latency-scale 0 --world-entities 150
  ppo spmd 150 trainer.total_steps=$((STEPS < 10 ? STEPS : 10)) trainer.backend=spmd
  ppo ray 200 trainer.total_steps=$((STEPS < 10 ? STEPS : 10)) trainer.backend=ray trainer.n_gpus_per_node=1 trainer.num_cpus_per_worker=${RAY_CPUS:-4}
  ;;
esac
stage "pack"
nvidia-smi --query-gpu=memory.used --format=csv,noheader
tar czf "$BACK/$PHASE.tgz" -C "$W/results" "$PHASE" && ls -la "$BACK/$PHASE.tgz"
