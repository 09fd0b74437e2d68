#!/usr/bin/env bash
# The commands that produced the files in docs/results/embedded_cpu/previous (2026-12-02, 2 shared CPU cores).
# `bash train.sh` is stages 1-5 in one go; here it ran as the same stages in two calls, so that
# the alpha-0.6 run could start from the very same warm start, and the SFT time limit (a 300 s
# safety valve, not reached on an idle machine: 750 steps take ~140 s) was lifted because the
# machine was shared with other jobs (load 6-12) and SFT ran 10-30x slower than when idle.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHON=${PYTHON:-python}
R=/tmp/h1
D=docs/results/embedded_cpu/previous
# stages 1-3: noisy + cautious oracle (noise 0.3, prefer_big 0.5), tokenizer, 750 SFT steps
OUT=$R/final SFT_ONLY=1 SFT_TIME_LIMIT= bash train.sh
# stages 4-5 from that warm start: alpha 0 (the default) and alpha 0.6, run side by side
OMP_NUM_THREADS=1 OUT=$R/final_a0 SFT_FROM=$R/final bash train.sh > $R/final_a0.log 2>&1 &
OMP_NUM_THREADS=1 OUT=$R/final_a06 SFT_FROM=$R/final EVAL_ALPHA=0.6 bash train.sh env.alpha=0.6 > $R/final_a06.log 2>&1 &
wait
# PPO metrics gzipped, as docs/results keeps them (tests/test_docs_budget.py); plot_runs reads .jsonl.gz
gzip -9 -n -c $R/final/sft/metrics.jsonl > $D/sft_metrics.jsonl.gz
gzip -9nc $R/final_a0/ppo/metrics.jsonl > $D/ppo_metrics.jsonl.gz
gzip -9nc $R/final_a06/ppo/metrics.jsonl > $D/alpha06_ppo_metrics.jsonl.gz
cp $R/final_a0/ppo/curves.png $D/ppo_curves.png
cp $R/final_a0/eval/summary.json $D/eval_summary.json
cp $R/final_a06/eval/summary.json $D/alpha06_eval_summary.json
cp $R/final_a0/eval/pareto.png $D/pareto.png
$PYTHON -m tools.analysis.plot_runs --run "alpha 0=$D/ppo_metrics.jsonl.gz" --run "alpha 0.6=$D/alpha06_ppo_metrics.jsonl.gz" \
  --out $D/alpha_curves.png
$PYTHON -m tools.analysis.eval_table $D/eval_summary.json $D/alpha06_eval_summary.json

# The KL 0.02 pair (kl02_*): stages 4-5 by experiments/embedded_cpu/ppo_only.sh (a copy of them that evaluates the PPO model
# only; the SFT row is the same greedy evaluation as above), from the same warm start:
for a in 0 0.6; do
  OMP_NUM_THREADS=1 EVAL_ALPHA=$a bash experiments/embedded_cpu/ppo_only.sh $R/final $R/fk_a$a env.alpha=$a algorithm.kl_ctrl.kl_coef=0.02 &
done; wait
gzip -9nc $R/fk_a0/ppo/metrics.jsonl > $D/kl02_ppo_metrics.jsonl.gz; gzip -9nc $R/fk_a0.6/ppo/metrics.jsonl > $D/kl02_alpha06_ppo_metrics.jsonl.gz
cp $R/fk_a0/eval/summary.json $D/kl02_eval_summary.json; cp $R/fk_a0.6/eval/summary.json $D/kl02_alpha06_eval_summary.json
$PYTHON -m tools.analysis.plot_runs --run "KL 0.001, alpha 0=$D/ppo_metrics.jsonl.gz" --run "KL 0.001, alpha 0.6=$D/alpha06_ppo_metrics.jsonl.gz" \
  --run "KL 0.02, alpha 0=$D/kl02_ppo_metrics.jsonl.gz" --run "KL 0.02, alpha 0.6=$D/kl02_alpha06_ppo_metrics.jsonl.gz" --out $D/alpha_curves.png
