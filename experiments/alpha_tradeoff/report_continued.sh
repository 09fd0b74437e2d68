#!/usr/bin/env bash
# (run from the repository root) table, Pareto plot and paired comparisons of the continued-SFT evaluations (outputs/alpha_tradeoff/eval6) into RESULTS
set -uo pipefail
E=outputs/alpha_tradeoff/eval6; R=docs/results/alpha_tradeoff
S=()
for d in baselines fixed_0 fixed_0.3 fixed_0.6 fixed_0.9 cond_0 cond_0.15 cond_0.3 cond_0.45 cond_0.6 cond_0.7 cond_0.8 cond_0.9 cond_1; do
  [ -f $E/$d/summary.json ] && S+=($E/$d/summary.json)
done
python -m router_r1.eval.report "${S[@]}" --out $R/pareto.png > $R/table.txt
{
  echo "# the conditioned SFT router told A minus told 0, on the same questions"
  for a in 0.15 0.3 0.45 0.6 0.7 0.8 0.9 1; do
    python -m tools.analysis.paired_evals $E/cond_0 $E/cond_$a --routers --out $R/paired_cond_${a}_vs_cond_0.json
  done
  echo "# the conditioned SFT router told A minus the fixed-alpha SFT router trained at A (same rows, epochs, steps)"
  for a in 0 0.3 0.6 0.9; do
    [ -f $E/fixed_$a/summary.json ] && python -m tools.analysis.paired_evals $E/fixed_$a $E/cond_$a --routers --out $R/paired_cond_vs_fixed_$a.json
  done
} > $R/paired.txt 2>&1
for d in $E/*/; do gzip -9c $d/summary.json > $R/summary_$(basename $d).json.gz; done
