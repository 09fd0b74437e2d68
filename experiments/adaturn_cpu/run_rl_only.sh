#!/usr/bin/env bash
# AdaTurn by RL alone: GRPO with sampled budgets and budget_mode=forced, started from the plain
# GRPO router (outputs/grpo, experiments/adaturn_cpu/grpo_run.sh) instead of a budget SFT.
set -euo pipefail
source "$(dirname "$0")/env.sh"
OUT=${OUT:-outputs/adaturn_rl}
mkdir -p "$OUT"
start_sim_pool "$OUT/pool_server.log"

$PY -m verl.trainer.main_ppo --config-name adaturn \
  "data.train_files=[$EMB/data/train.parquet]" "data.val_files=[$EMB/data/val.parquet]" \
  model.path=outputs/grpo model.tokenizer=outputs/grpo "env.pool_url=$URL" "trainer.output_dir=$OUT/grpo" \
  "env.prompt_template=$EMB/oracle/prompt_template.txt" trainer.total_steps=${STEPS:-40} "$@"
cp "$EMB/oracle/prompt_template.txt" "$OUT/grpo/hf/prompt_template.txt"

$PY -m tools.analysis.eval_budgets --checkpoint "rl_only_grpo=$OUT/grpo/hf" --data "$EMB/data/test.parquet" \
  --budgets 1 2 4 8 --modes end forced --out "$OUT/budgets" -- --sim --max-obs-length 128 \
  --response-length 64 --max-response-length 512
