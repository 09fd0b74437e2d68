#!/usr/bin/env bash
# RL from the card-listing uniform warm start, trained to convergence (issue 44.2). The warm start: the recipe
# configs/recipes/uniform_card.yaml (card listing, routes drawn uniformly) with SFT_EPOCHS SFT epochs (12: at train.sh's
# 6 this start answers a third of the two-hop questions after one hop). Then each arm from it at alpha 0.6, T 0.7, no
# KL loss, STEPS steps, per RL seed; each is evaluated greedily beside the warm start on the 300 test questions
# (paired), and tools/analysis/route_probs reads its names' probabilities at the warm start's routes.
#   bash experiments/card_start/run.sh OUT      SEEDS ("1 2 3"), ARMS ("dw10"; "plain|dw10"), PARALLEL (3 runs at
#                                               a time), THREADS (1 each), SFT_EPOCHS (12), STEPS (300)
# A warm start already in OUT/warm, or a run already evaluated in OUT/<arm>_s<seed>, is kept.
# Records: python -m experiments.forked_groups.summarize OUT --records docs/results/card_start
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: run.sh OUT}
PY=${PYTHON:-python}
SEEDS=${SEEDS:-1 2 3} ARMS=${ARMS:-dw10} PARALLEL=${PARALLEL:-3}
declare -A FLAGS=(
  [plain]="actor.use_kl_loss=false"
  # the model names' advantage x10 (they are ~7% of the policy's tokens): the run that learned most of the table
  # from the 6-epoch start (docs/rl_diagnosis.md section 17)
  [dw10]="actor.use_kl_loss=false algorithm.decision_parts=[route_model,think_model] algorithm.decision_adv_weight=10"
)
COMMON="env.alpha=0.6 rollout.temperature=0.7 trainer.total_steps=${STEPS:-300}"
mkdir -p "$OUT"
WARM="$OUT/warm"
if [ ! -f "$WARM/sft/model.safetensors" ]; then
  OMP_NUM_THREADS=${THREADS:-1} RECIPE=configs/recipes/uniform_card.yaml SEED=1 SFT_EPOCHS=${SFT_EPOCHS:-12} \
    SFT_ONLY=1 OUT="$WARM" bash train.sh > "$WARM.log" 2>&1
fi
one() {  # arm seed
  local run="$OUT/$1_s$2"
  [ -f "$run/eval/summary.json" ] && return 0
  # shellcheck disable=SC2086  # the flags are words
  OMP_NUM_THREADS=${THREADS:-1} SEED=$2 SFT_FROM="$WARM" OUT="$run" EVAL_BASELINES= bash train.sh $COMMON ${FLAGS[$1]} \
    > "$run.log" 2>&1
  OMP_NUM_THREADS=1 $PY -m tools.analysis.route_probs --checkpoint "$run/ppo/hf" --data "$WARM/data/test.parquet" \
    --trajectories "$run/eval/trajectories.jsonl" --run "SFT router" --pool configs/pool/sim.yaml \
    --out "$run/route_probs.md" >> "$run.log" 2>&1
}
IFS='|' read -ra arms <<< "$ARMS"
for s in $SEEDS; do
  for a in "${arms[@]}"; do
    [ -n "${FLAGS[$a]+x}" ] || { echo "run.sh: unknown arm $a (known: ${!FLAGS[*]})" >&2; exit 2; }
    one "$a" "$s" &
    while [ "$(jobs -rp | wc -l)" -ge "$PARALLEL" ]; do wait -n; done
  done
done
wait
$PY -m experiments.forked_groups.summarize "$OUT" --records "${RECORDS:-$OUT}"
