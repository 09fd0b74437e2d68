#!/usr/bin/env bash
# Several SFT draws of run_gemma_unseen.sh side by side on one H200 (three at a time ran at EVAL_BATCH=64; at 256
# one evaluation grew to 130 GB and an SFT beside it ran out of memory), one per oracle seed, into DIR/PREFIX<seed>. The recipe
# comes from the environment as for run_gemma_unseen.sh (THINK, RIVAL, FALLBACK, DRILL, BANK, ...). The bundle
# pieces must be in $PIECES already (experiments/gemma_h200/gemma_bundle.sh).
#   THINK=1 RIVAL=0.8 VARY=0 FALLBACK=listed DRILL=0.1 BANK=1000 \
#     bash experiments/gemma_unseen/run_gemma_unseen_seeds.sh $OUT r8s 0 1 2
set -uo pipefail
DIR=${1:?where the runs go} PREFIX=${2:?run name prefix}; shift 2
[ $# -ge 1 ] || { echo "usage: $0 DIR PREFIX SEED..." >&2; exit 2; }
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True} EVAL_BATCH=${EVAL_BATCH:-64}
HERE=$(dirname "$0")
for seed in "$@"; do
  SEED=$seed RUN=/tmp/gu_$PREFIX$seed timeout "${RUN_LIMIT_S:-540}" bash "$HERE/run_gemma_unseen.sh" "$DIR/$PREFIX$seed" \
    > "/tmp/log_$PREFIX$seed" 2>&1 &
  sleep 15  # staggered: the oracle rows and tokenizer builds do not all start at once
done
wait
for seed in "$@"; do
  # a draw cut by RUN_LIMIT_S never reached its own tarball: pack what it finished (same files as the script's)
  if [ ! -f "$DIR/$PREFIX$seed/unseen_run.tgz" ] && [ -d "/tmp/gu_$PREFIX$seed" ]; then
    mkdir -p "$DIR/$PREFIX$seed"  # run.txt is there: the killed script's subshell writes it
    echo "rc timeout (RUN_LIMIT_S ${RUN_LIMIT_S:-540})" >> "$DIR/$PREFIX$seed/run.txt"
    (cd "/tmp/gu_$PREFIX$seed" && find . -type f ! -name '*.safetensors' ! -name '*.pt' ! -name '*.parquet' \
       ! -name 'tokenizer*' -size -4M | tar czf "$DIR/$PREFIX$seed/unseen_run.tgz" -T -)
  fi
  echo "== $PREFIX$seed"
  grep -h "sft: \|SFT router - SFT\|share of calls\|^rc " "$DIR/$PREFIX$seed/run.txt" 2>/dev/null || tail -3 "/tmp/log_$PREFIX$seed"
done
