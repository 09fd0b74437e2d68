#!/usr/bin/env bash
# AdaTurn's forced answer against its two baselines (issue 8), in one experiment: the same GRPO
# (configs/adaturn.yaml, same seed, same steps) from the same warm start (the budget-oracle SFT
# model of run.sh's v2 run, outputs/adaturn_v2/sft), three times, differing only in
# env.budget_mode = forced | mask | penalize. Then EM / unanswered / calls per budget 1 2 4 8 of
# each, evaluated with the end limit (what mask and penalize train with) and with forced.
# Needs `OUT=outputs/adaturn_v2 TAG=v2 PLAIN=0 bash run.sh` (or its SFT stage) and train.sh first.
#   STEPS=40 bash experiments/adaturn_cpu/run_modes.sh      # the numbers in docs/results/adaturn_cpu/modes.md (seeds: data 42, sampling 1)
#   STEPS=40 OUT=outputs/adaturn_modes/seed2 RESULTS=outputs/adaturn_modes/seed2 \
#     EXTRA="data.seed=43 trainer.seed=2" bash experiments/adaturn_cpu/run_modes.sh   # the second seed
#   (then: cp $OUT/modes.json modes_seed2.json, $OUT/modes.png modes_seed2.png, $OUT/modes_curves.png
#    modes_seed2_curves.png, in docs/results/adaturn_cpu)
# The three trainings run side by side (2 shared CPU cores, nice -n 10), one pool server each.
set -euo pipefail
source "$(dirname "$0")/env.sh"
WARM=${WARM:-outputs/adaturn_v2/sft}
TEMPLATE=${TEMPLATE:-outputs/adaturn_v2/oracle/prompt_template.txt}
OUT=${OUT:-outputs/adaturn_modes}
MODES=(${MODES:-forced mask penalize})
mkdir -p "$OUT"

train() (  # train MODE: its own pool server + GRPO with env.budget_mode=MODE (a subshell: URL is its own)
  local mode=$1
  mkdir -p "$OUT/$mode"
  start_sim_pool "$OUT/$mode/pool_server.log"
  # lr and ppo_epochs pinned: configs/embedded.yaml (which adaturn.yaml extends) has changed under us before
  nice -n 10 $PY -m verl.trainer.main_ppo --config-name adaturn \
    "data.train_files=[$EMB/data/train.parquet]" "data.val_files=[$EMB/data/val.parquet]" \
    "model.path=$WARM" "model.tokenizer=$WARM" "env.pool_url=$URL" "trainer.output_dir=$OUT/$mode/grpo" \
    "env.prompt_template=$TEMPLATE" "env.budget_mode=$mode" trainer.experiment_name=adaturn_$mode \
    actor.lr=3e-4 actor.ppo_epochs=2 trainer.total_steps=${STEPS:-40} ${EXTRA:-} >"$OUT/$mode/train.log" 2>&1
  cp "$TEMPLATE" "$OUT/$mode/grpo/hf/prompt_template.txt"
)
TRAIN=()
for m in "${MODES[@]}"; do train "$m" & TRAIN+=($!); done
for p in "${TRAIN[@]}"; do wait "$p"; done  # set -e: a failed training stops here

# Evaluation: every trained router under the end limit (mask/penalize at inference are end: both only
# change training) and under forced; greedy, the 300 test questions, budget sentence in the prompt.
CKPTS=()
for m in "${MODES[@]}"; do CKPTS+=(--checkpoint "train_$m=$OUT/$m/grpo/hf"); done
nice -n 10 $PY -m tools.analysis.eval_budgets "${CKPTS[@]}" --data "$EMB/data/test.parquet" --budgets 1 2 4 8 \
  --modes end forced --out "$OUT/budgets" -- --sim --max-obs-length 128 --response-length 64 \
  --max-response-length 512

# One table + PNG (EM, unanswered, calls per budget, per training mode) and the training curves.
$PY -m tools.analysis.adaturn_modes --budgets "$OUT/budgets/budgets.json" \
  $(for m in "${MODES[@]}"; do echo "--metrics $m=$OUT/$m/grpo/metrics.jsonl"; done) --out "${RESULTS:-docs/results/adaturn_cpu}"
