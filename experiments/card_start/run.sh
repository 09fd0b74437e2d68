#!/usr/bin/env bash
# RL from the card-listing uniform warm start, trained to convergence (issue 44.2). The warm start: the recipe
# configs/recipes/uniform_card.yaml (card listing, routes drawn uniformly) with SFT_EPOCHS SFT epochs (12: at train.sh's
# 6 this start answers a third of the two-hop questions after one hop). Then experiments/forked_groups/run.sh trains
# each arm from it (alpha 0.6, T 0.7, STEPS steps, per RL seed; the arms' flags are there), evaluates each greedily
# beside the warm start on the 300 test questions (paired), reads its names' probabilities at the warm start's routes
# (tools/analysis/route_probs) and writes the summary.
#   bash experiments/card_start/run.sh OUT      SEEDS ("1 2 3"), ARMS ("dw10_klc_lr2"; "dw10|dw10_klc_lr2"), PARALLEL
#                                               (3 runs at a time), THREADS (1 each), SFT_EPOCHS (12), STEPS (300),
#                                               TIME_LIMIT (seconds of training a run; 1800 = 44.2's budget)
# A warm start already in OUT/warm, or a run already evaluated in OUT/<arm>_s<seed>, is kept.
# Records: python -m experiments.forked_groups.summarize OUT --records docs/results/card_start
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: run.sh OUT}
WARM="$OUT/warm"
mkdir -p "$OUT"
if [ ! -f "$WARM/sft/model.safetensors" ]; then
  OMP_NUM_THREADS=${THREADS:-1} RECIPE=configs/recipes/uniform_card.yaml SEED=1 SFT_EPOCHS=${SFT_EPOCHS:-12} \
    SFT_ONLY=1 OUT="$WARM" bash train.sh > "$WARM.log" 2>&1
fi
ARMS=${ARMS:-dw10_klc_lr2} PARALLEL=${PARALLEL:-3} exec bash experiments/forked_groups/run.sh "$WARM" "$OUT"
