#!/usr/bin/env bash
# The routing table under each credit estimator at the route (tools/analysis/route_ascent.py), from one warm start.
#   bash experiments/route_credit/run.sh SFT DATA OUT     SFT: a warm start (HF dir); DATA: its data dir (train/test.parquet)
# VARIANTS (default below) run one after another, OMP_NUM_THREADS 1 each; UPDATES (600) updates; then the summary.
set -euo pipefail
cd "$(dirname "$0")/../.."
SFT=${1:?usage: run.sh SFT DATA OUT} DATA=${2:?usage: run.sh SFT DATA OUT} OUT=${3:?usage: run.sh SFT DATA OUT}
PY=${PYTHON:-python}
UPDATES=${UPDATES:-600}
VARIANTS=${VARIANTS:-"exact:--estimator exact|sampled:--estimator sampled|sampled_batch192:--estimator sampled --batch 192|samples4:--estimator sampled --samples 4|samples4_batch6:--estimator sampled --samples 4 --batch 6|samples4_batch6_ppo2:--estimator sampled --samples 4 --batch 6 --ppo-epochs 2 --updates 300|entropy0.05:--estimator sampled --entropy-coef 0.05|critic:--estimator critic|critic_explore0.3:--estimator critic --explore 0.3"}
mkdir -p "$OUT"
IFS='|' read -ra runs <<< "$VARIANTS"
for run in "${runs[@]}"; do
  name=${run%%:*} flags=${run#*:}
  echo "== $name ($flags)"
  # shellcheck disable=SC2086  # the variant's flags are words
  OMP_NUM_THREADS=1 $PY -m tools.analysis.route_ascent --checkpoint "$SFT" --data "$DATA/train.parquet" \
    --eval-data "$DATA/test.parquet" --pool configs/pool/sim.yaml --updates "$UPDATES" --every 50 $flags \
    --out "$OUT/$name.jsonl" | tee "$OUT/$name.log"
done
$PY -m experiments.route_credit.summarize "$OUT" --records "${RECORDS:-$OUT}"
