#!/usr/bin/env bash
# The commands that produced the files in docs/results/embedded_cpu (2026-12-02, 2 CPU cores shared with other
# jobs, load 3-4). One job at a time, OMP_NUM_THREADS=1. The first call is `bash train.sh` as it
# stands except for the KL-in-the-loss keys, which were added to configs/embedded.yaml after it
# (its PPO row is the "no KL loss" ablation); the default PPO row is stages 4-5 of the committed
# config from that same warm start.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHON=${PYTHON:-python} OMP_NUM_THREADS=1
R=/tmp/i4
D=docs/results/embedded_cpu
# stages 1-5 (oracle: noise 0.2, prefer_big 0.3, confuse 0.8 on people/science; 750 SFT steps;
# 40 PPO steps WITHOUT actor.use_kl_loss, i.e. the ablation row)
OUT=$R/c1 bash train.sh actor.use_kl_loss=false > $R/c1.log 2>&1
# stages 4-5 of the committed default (KL 0.1 in the loss) from that warm start, alpha 0 and 0.6
OUT=$R/k1 SFT_FROM=$R/c1 bash train.sh > $R/k1.log 2>&1
OUT=$R/k1a06 SFT_FROM=$R/c1 EVAL_ALPHA=0.6 bash train.sh env.alpha=0.6 > $R/k1a06.log 2>&1
# GRPO ablation (4 samples x 16 prompts, KL 0.001 in the loss) from the same warm start
OUT=$R/g1 SFT_FROM=$R/c1 bash train.sh algorithm.adv_estimator=grpo rollout.n=4 data.train_batch_size=16 \
  actor.ppo_mini_batch_size=32 actor.use_kl_loss=true actor.kl_loss_coef=0.001 algorithm.use_kl_in_reward=false > $R/g1.log 2>&1
# more, less repeated SFT data (3200 trajectories x 4 epochs = 800 steps), then the default PPO
OUT=$R/d1 N_ORACLE=3200 SFT_EPOCHS=4 bash train.sh > $R/d1.log 2>&1

# PPO metrics gzipped, as docs/results keeps them (tests/test_docs_budget.py); plot_runs reads .jsonl.gz
gzip -9 -n -c $R/c1/sft/metrics.jsonl > $D/sft_metrics.jsonl.gz
gzip -9nc $R/k1/ppo/metrics.jsonl > $D/ppo_metrics.jsonl.gz; cp $R/k1/ppo/curves.png $D/ppo_curves.png
gzip -9nc $R/k1a06/ppo/metrics.jsonl > $D/alpha06_ppo_metrics.jsonl.gz
cp $R/k1/eval/summary.json $D/eval_summary.json; cp $R/k1a06/eval/summary.json $D/alpha06_eval_summary.json
cp $R/k1/eval/pareto.png $D/pareto.png
gzip -9nc $R/c1/ppo/metrics.jsonl > $D/nokl_ppo_metrics.jsonl.gz; cp $R/c1/eval/summary.json $D/nokl_eval_summary.json
gzip -9nc $R/g1/ppo/metrics.jsonl > $D/grpo_ppo_metrics.jsonl.gz; cp $R/g1/eval/summary.json $D/grpo_eval_summary.json
cp $R/d1/eval/summary.json $D/data3200_eval_summary.json; gzip -9nc $R/d1/ppo/metrics.jsonl > $D/data3200_ppo_metrics.jsonl.gz
for r in c1 k1 k1a06 g1 d1; do $PYTHON -m tools.analysis.diagnose_failures $R/$r/eval/trajectories.jsonl > $D/diagnose_$r.txt; done
$PYTHON -m tools.analysis.plot_runs --run "KL loss 0.1, alpha 0=$D/ppo_metrics.jsonl.gz" --run "KL loss 0.1, alpha 0.6=$D/alpha06_ppo_metrics.jsonl.gz" \
  --run "no KL loss, alpha 0=$D/nokl_ppo_metrics.jsonl.gz" --run "GRPO, alpha 0=$D/grpo_ppo_metrics.jsonl.gz" --out $D/alpha_curves.png
$PYTHON -m tools.analysis.eval_table $D/eval_summary.json $D/alpha06_eval_summary.json $D/nokl_eval_summary.json $D/grpo_eval_summary.json \
  $D/data3200_eval_summary.json
