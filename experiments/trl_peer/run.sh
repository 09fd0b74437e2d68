#!/usr/bin/env bash
# Our GRPO against TRL's GRPOTrainer on the single-turn routing task (issue 43 item 6), seeds one after another.
#   bash experiments/trl_peer/run.sh OUT [--flag value ...]     flags: experiments/trl_peer/settings.py (both trainers)
# SFT (outputs/embedded/sft) the warm start, SRC (outputs/embedded/data/train.parquet) its QA rows, SEEDS ("1 2 3"),
# STEPS (40). Each seed's 1-hop rows go to OUT/data, each run to OUT/<ours|peer>/seed<N> (its log beside it), then
# python -m experiments.trl_peer.summarize --collect OUT --records RECORDS (RECORDS: docs/results/trl_peer; empty: skip).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: run.sh OUT [--flag value ...]}; shift
PY=${PYTHON:-python}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
SFT=${SFT:-outputs/embedded/sft} SRC=${SRC:-outputs/embedded/data/train.parquet}
SEEDS=${SEEDS:-1 2 3} STEPS=${STEPS:-40} RECORDS=${RECORDS-docs/results/trl_peer}
$PY -c "import trl" 2>/dev/null || { echo "TRL is not installed: pip install -e \".[peer]\"" >&2; exit 2; }
for seed in $SEEDS; do
  $PY -m experiments.trl_peer.task --src "$SRC" --out "$OUT/data/seed$seed.parquet" --seed "$seed"
  for trainer in ours peer; do
    mkdir -p "$OUT/$trainer/seed$seed"
    $PY -m "experiments.trl_peer.$trainer" --data "$OUT/data/seed$seed.parquet" --sft "$SFT" \
      --out "$OUT/$trainer/seed$seed" --seed "$seed" --steps "$STEPS" "$@" > "$OUT/$trainer/seed$seed.log" 2>&1 \
      || { echo "$trainer seed $seed failed: see $OUT/$trainer/seed$seed.log" >&2; exit 1; }
    echo "$trainer seed $seed: $(tail -1 "$OUT/$trainer/seed$seed/curve.jsonl")"
  done
done
[ -z "$RECORDS" ] || $PY -m experiments.trl_peer.summarize --collect "$OUT" --records "$RECORDS"
