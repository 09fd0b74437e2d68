#!/usr/bin/env bash
# Evaluate router checkpoints (and baselines) on test sets: EM with a 95% bootstrap CI, F1,
# format rate, cost, pool calls and model shares per data source; writes summary.json,
# trajectories.jsonl and pareto.png (EM against cost) and prints a table.
#
#   bash test.sh                                    # the embedded checkpoint on its sim test set, beside
#                                                   # every pool model alone and the routing baselines
#   bash test.sh --baseline all-singles             # ... beside every pool model alone only
#   bash test.sh --checkpoint DIR --data 'data/router_r1/test_*.parquet' \
#                --pool configs/pool/paper.yaml --pool-url http://HOST:8000/v1
#   bash test.sh --checkpoint A1 --checkpoint A2 --alpha 0.9   # several checkpoints: one plot
#   bash test.sh --budget 2 --budget-mode forced    # under a turn budget of 2, stated in the prompt (AdaTurn)
#
# Every argument goes to `python -m router_r1.eval.evaluate` (--help lists them all). The episode's
# shape (turns, lengths, schedule, alpha) is the one the checkpoint was trained with, read from the
# run_config.yaml its run wrote beside it; a flag (--max-turns 2, --alpha 0.6, ...) overrides it.
# --checkpoint and --data default to the embedded default's (ROUTER_CKPT, ROUTER_TEST_DATA
# override them; the data is the first of DATA_CANDIDATES that exists). Without --pool the
# simulated pool is served in-process. Greedy unless --temperature T [--seed S] is given.
# On the embedded default's data and pool (no --data, --pool, --pool-url) and without --baseline, the
# baselines of TEST_BASELINES run too (default "all": every single model, oracle, oracle-hops, knn, mlp;
# empty: none).
# PYTHON picks the interpreter.
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-python}
CKPT=${ROUTER_CKPT:-outputs/embedded/hf}
# The embedded default's simulated test set: the first of these that exists.
DATA_CANDIDATES=(outputs/embedded/data/test.parquet data/embedded/test.parquet data/sim/test.parquet)
DATA=${ROUTER_TEST_DATA:-}
if [[ -z $DATA ]]; then
  for f in "${DATA_CANDIDATES[@]}"; do [[ -e $f ]] && { DATA=$f; break; }; done
  DATA=${DATA:-${DATA_CANDIDATES[0]}}
fi

given() {  # is option $1 among the arguments?
  local a
  for a in "${ARGS[@]}"; do [[ $a == "$1" || $a == "$1="* ]] && return 0; done
  return 1
}

ARGS=("$@")
DEFAULTS=()
if ! given --checkpoint && ! given --skip-router; then
  DEFAULTS+=(--checkpoint "$CKPT")
fi
if ! given --baseline && ! given --pool && ! given --pool-url && ! given --data; then
  for b in ${TEST_BASELINES-all}; do DEFAULTS+=(--baseline "$b"); done
fi
if ! given --data; then
  if [[ ! -e $DATA ]]; then
    echo "error: no test data at $DATA; run bash train.sh first or pass --data" >&2
    exit 2
  fi
  DEFAULTS+=(--data "$DATA")
fi

exec "$PYTHON" -m router_r1.eval.evaluate "${DEFAULTS[@]}" "$@"
