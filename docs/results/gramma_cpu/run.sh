#!/usr/bin/env bash
# GraMMA on the synthetic knowledge graph, CPU: data -> oracle -> SFT -> PPO -> evaluation.
#   bash docs/results/gramma_cpu/run.sh [hydra overrides for the PPO stage]
# Outputs under $OUT (default outputs/gramma); the numbers in README.md came from this script.
set -euo pipefail
cd "$(dirname "$0")/../../.."
PY=${PYTHON:-python}
OUT=${OUT:-outputs/gramma}
N_ORACLE=${N_ORACLE:-1500}
SFT_EPOCHS=${SFT_EPOCHS:-4}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} TOKENIZERS_PARALLELISM=false
start=$(date +%s)
stage() { echo; echo "== [$(( $(date +%s) - start ))s] $*"; }

stage "1/5 synthetic graph and questions"
$PY -m data_process.kg_synth --out-dir "$OUT/data"

stage "2/5 oracle trajectories, tokenizer, model config"
$PY -m data_process.kg_oracle --data "$OUT/data/train.parquet" --graph "$OUT/data/graph" --out-dir "$OUT/oracle" \
  --n "$N_ORACLE" --noise 0.3 --point

stage "3/5 supervised warm start"
$PY -m verl.trainer.sft --data "$OUT/oracle/oracle.parquet" --model "$OUT/oracle/model.json" \
  --tokenizer "$OUT/oracle/tokenizer" --out "$OUT/sft" --epochs "$SFT_EPOCHS" --lr 5e-3 --batch-size 16 \
  --context-loss-weight 1.0 --max-length 1024 --time-limit-s 1800

stage "4/5 GRPO on the graph environment (no critic, no reference)"
$PY -m verl.trainer.main_ppo --config-name gramma \
  "data.train_files=[$OUT/data/train.parquet]" "data.val_files=[$OUT/data/val.parquet]" data.val_limit=64 \
  "model.path=$OUT/sft" "model.tokenizer=$OUT/sft" "env.graph_dir=$OUT/data/graph" \
  "trainer.output_dir=$OUT/ppo" algorithm.adv_estimator=grpo rollout.n=4 data.train_batch_size=8 \
  actor.ppo_mini_batch_size=32 actor.ppo_micro_batch_size=16 algorithm.use_kl_in_reward=false \
  critic.enable=false actor.lr=1e-4 trainer.total_steps=40 trainer.test_freq=20 "$@"

stage "5/5 evaluation on the held-out test questions (greedy)"
$PY -m gramma.evaluate --data "$OUT/data/test.parquet" --graph "$OUT/data/graph" \
  --checkpoint "$OUT/sft" --checkpoint "$OUT/ppo/hf" --out "$OUT/eval"
stage "done"
