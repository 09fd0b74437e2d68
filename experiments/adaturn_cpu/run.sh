#!/usr/bin/env bash
# AdaTurn on the embedded default, 2 CPU cores: the exact commands behind README.md here.
# Needs `bash train.sh` (and experiments/adaturn_cpu/grpo_run.sh) first: it reuses their
# test data, tokenizer, model config and the plain checkpoints it compares against.
#   1. budget-aware oracle trajectories (budgets 1-6 in the prompt, forced-answer examples)
#   2. SFT on them, starting from the plain router's SFT model (same tokenizer and size); a
#      from-scratch SFT (750 steps) did not fit the shared CPU this was measured on
#   3. GRPO with sampled budgets and budget_mode=forced (configs/adaturn.yaml)
#   4. EM / cost / calls / forced / truncated per budget 1, 2, 4, 8 for both routers
set -euo pipefail
source "$(dirname "$0")/env.sh"
OUT=${OUT:-outputs/adaturn}
mkdir -p "$OUT"

# configs/recipes/budget.yaml: 2,000 rows, budgets 1-6, forced share 0.5, noise 0.2, no tokenizer (the embedded one's)
$PY -m sim.warm_start --recipe configs/recipes/budget.yaml --out-dir "$OUT/oracle" \
  --prompt-template "$EMB/oracle/prompt_template.txt" --report

$PY -m verl.trainer.sft --data "$OUT/oracle/oracle.parquet" --model "$EMB/sft" --out "$OUT/sft" \
  --epochs 2 --max-steps ${SFT_STEPS:-250} --lr ${SFT_LR:-5e-4} --batch-size 16 --context-loss-weight 1.0 \
  --time-limit-s 1200
cp "$OUT/oracle/prompt_template.txt" "$OUT/sft/prompt_template.txt"

start_sim_pool "$OUT/pool_server.log"

$PY -m verl.trainer.main_ppo --config-name adaturn \
  "data.train_files=[$EMB/data/train.parquet]" "data.val_files=[$EMB/data/val.parquet]" \
  "model.path=$OUT/sft" "model.tokenizer=$OUT/sft" "env.pool_url=$URL" "trainer.output_dir=$OUT/grpo" \
  "env.prompt_template=$OUT/oracle/prompt_template.txt" trainer.total_steps=${STEPS:-40} "$@"
cp "$OUT/oracle/prompt_template.txt" "$OUT/grpo/hf/prompt_template.txt"

# Budget-aware: SFT and SFT+GRPO; plain (no budget in training): the embedded PPO and GRPO routers
# (PLAIN=0 leaves those out, e.g. for a second budget-aware run beside a first one's table).
PLAINS=()
[ "${PLAIN:-1}" = 1 ] && PLAINS=(--plain "plain_ppo=$EMB/hf" --plain plain_grpo=outputs/grpo)
$PY -m tools.analysis.eval_budgets --checkpoint "${TAG:-adaturn}_grpo=$OUT/grpo/hf" --checkpoint "${TAG:-adaturn}_sft=$OUT/sft" \
  "${PLAINS[@]}" --data "$EMB/data/test.parquet" --budgets 1 2 4 8 \
  --modes end forced --out "$OUT/budgets" -- --sim --max-obs-length 128 --response-length 64 \
  --max-response-length 512
