#!/usr/bin/env bash
# The default PPO recipe with the entity-name rows frozen (docs/rl_diagnosis.md section 12), from rl_seeds' warm starts:
#   SEEDS="1 2 3" bash experiments/rl_frozen_names/run.sh WARM OUT [overrides...]
# WARM holds warm_s<seed> (experiments/rl_seeds/run.sh's OUT); each seed gets OUT/src_s<seed> (the frozen copy) and
# OUT/frozen_s<seed> (train.sh with SFT_FROM=that copy: PPO, then the paired test evaluation beside the warm start).
# Seeds run side by side, one thread each.
set -euo pipefail
cd "$(dirname "$0")/../.."
WARM=${1:?usage: run.sh WARM OUT [overrides...]}
OUT=${2:?usage: run.sh WARM OUT [overrides...]}
shift 2
export PYTHON=${PYTHON:-python} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mkdir -p "$OUT"
for s in ${SEEDS:-1 2 3}; do
  [ -d "$OUT/src_s$s" ] || $PYTHON -m experiments.rl_frozen_names.freeze "$WARM/warm_s$s" "$OUT/src_s$s"
  SEED=$s SFT_FROM="$OUT/src_s$s" OUT="$OUT/frozen_s$s" EVAL_BASELINES= bash train.sh "$@" > "$OUT/frozen_s$s.log" 2>&1 &
done
wait
