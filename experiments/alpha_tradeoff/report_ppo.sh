#!/usr/bin/env bash
# (run from the repository root, after ppo_continued.sh) table, Pareto plot and paired comparisons of the PPO runs
# (outputs/alpha_tradeoff/eval6p; the baselines are continue_and_eval.sh's) into docs/results/alpha_tradeoff/*_ppo*
set -uo pipefail
E=outputs/alpha_tradeoff/eval6p; R=docs/results/alpha_tradeoff
S=(outputs/alpha_tradeoff/eval6/baselines/summary.json)
for d in fixed_0 fixed_0.3 fixed_0.6 fixed_0.9 cond_0 cond_0.15 cond_0.3 cond_0.45 cond_0.6 cond_0.7 cond_0.8 cond_0.9 cond_1; do
  [ -f $E/$d/summary.json ] && S+=($E/$d/summary.json)
done
python -m router_r1.eval.report "${S[@]}" --out $R/pareto_ppo.png > $R/table_ppo.txt
{
  echo "# after PPO: the conditioned router told A minus told 0, on the same questions"
  for a in 0.15 0.3 0.45 0.6 0.7 0.8 0.9 1; do
    [ -f $E/cond_$a/summary.json ] && python -m tools.analysis.paired_evals $E/cond_0 $E/cond_$a --routers --out $R/paired_ppo_cond_${a}_vs_cond_0.json
  done
  echo "# after PPO: the conditioned router told A minus the fixed-alpha router trained at A (same warm-start budget, same PPO steps)"
  for a in 0 0.3 0.6 0.9; do
    [ -f $E/fixed_$a/summary.json ] && python -m tools.analysis.paired_evals $E/fixed_$a $E/cond_$a --routers --out $R/paired_ppo_cond_vs_fixed_$a.json
  done
  echo "# PPO minus its SFT warm start, the same router told the same alpha"
  for d in cond_0 cond_0.3 cond_0.6 cond_0.9 fixed_0 fixed_0.3 fixed_0.6 fixed_0.9; do
    [ -f $E/$d/summary.json ] && python -m tools.analysis.paired_evals outputs/alpha_tradeoff/eval6/$d $E/$d --routers --out $R/paired_ppo_minus_sft_$d.json
  done
} > $R/paired_ppo.txt 2>&1
for d in $E/*/; do gzip -9c $d/summary.json > $R/summary_ppo_$(basename $d).json.gz; done
