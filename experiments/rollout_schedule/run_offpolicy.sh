#!/usr/bin/env bash
# On-policy vs one-step off-policy PPO, end to end: a warm-started router (`SFT=` its directory,
# `DATA=` the simulated QA parquet files that train.sh / experiments/gemma_h200/pipeline_gpu.sh write) against the
# simulated pool server with realistic latency (x2: ~0.5-3 s per call, heavy tail). The two runs go
# one after the other: same seed, same data order, same latency profile. Extra arguments are
# hydra overrides for both runs.
#
#   CPU (the embedded 0.85M policy):
#   SFT=outputs/embedded/sft DATA=outputs/embedded/data bash experiments/rollout_schedule/run_offpolicy.sh
#   one GPU (the 270M pipeline policy; hf_static rollouts, overlap = pool + CPU env):
#   SFT=outputs/gpu_pipeline/sft DATA=outputs/gpu_pipeline/data STEPS=40 POOL_FLAGS="--world-entities 150" bash experiments/rollout_schedule/run_offpolicy.sh \
#     trainer.device=cuda model.dtype=auto rollout.name=hf_static data.train_batch_size=64 rollout.max_batch_size=128 \
#     actor.ppo_mini_batch_size=32 actor.ppo_micro_batch_size=32 critic.ppo_mini_batch_size=32 critic.ppo_micro_batch_size=32
#   two GPUs in one process (the rollout engine on the second: the whole rollout runs beside the update):
#   ... the same, plus rollout.device=cuda:1
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python}
SFT=${SFT:?the SFT model directory (train.sh stage 3)}
DATA=${DATA:?the directory with train.parquet and val.parquet}
OUT=${OUT:-outputs/offpolicy}
STEPS=${STEPS:-10}
LATENCY=${LATENCY:-2}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT"
source tools/sim_pool.sh
start_sim_pool "$OUT/pool_server.log" --latency-scale "$LATENCY" ${POOL_FLAGS:-}  # the world the data was built in
for k in 0 1; do
  $PY -m verl.trainer.main_ppo --config-name embedded \
    "data.train_files=[$DATA/train.parquet]" "data.val_files=[$DATA/val.parquet]" \
    "model.path=$SFT" "model.tokenizer=$SFT" "env.pool_url=$URL" "trainer.output_dir=$OUT/off$k" \
    trainer.total_steps="$STEPS" trainer.test_freq=0 trainer.val_before_train=false trainer.export_hf=false \
    trainer.resume=none trainer.off_policy_steps=$k "$@"
done
$PY -m experiments.rollout_schedule.summarize "$OUT/off0/metrics.jsonl" "$OUT/off1/metrics.jsonl" --plot "$OUT/offpolicy.png"
