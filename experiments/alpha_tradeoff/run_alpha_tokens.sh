#!/usr/bin/env bash
# The conditioned router again, with every stated alpha one token (sim/warm_start/alpha.py's ALPHA_WORDS): the same
# oracle rows as run_tradeoff.sh's conditioned set (same seeds and flags), a tokenizer that adds the alpha words,
# one straight 6-epoch SFT (750 steps; the recorded SFTs were 375 + a continued 375), then told each alpha on
# the 300 test questions and paired with the recorded fixed-alpha SFTs (REF: run_tradeoff.sh's OUT after
# continue_and_eval.sh).
#   REF=outputs/alpha_tradeoff bash experiments/alpha_tradeoff/run_alpha_tokens.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} TOKENIZERS_PARALLELISM=false
REF=${REF:-outputs/alpha_tradeoff} OUT=${OUT:-outputs/alpha_tokens} POOL=configs/pool/sim_tradeoff.yaml
O=$OUT/oracle T=$OUT/sft_cond_told E=$OUT/eval
mkdir -p "$OUT/logs"
python -m sim.warm_start --out-dir "$O" --pool "$POOL" --n 2000 --alphas 0 0.3 0.6 0.9 --noise 0.05 \
  --rename 1 --whole-names > "$OUT/logs/oracle.txt"
python -m verl.trainer.main_ppo --config-name sft "data.sft_files=[$O/oracle.parquet]" "model.path=$O/model.json" \
  "model.tokenizer=$O/tokenizer" "trainer.output_dir=$OUT/sft_cond" "trainer.hf_dir=$OUT/sft_cond" trainer.resume=none \
  trainer.total_epochs=6 actor.lr=5e-3 data.train_batch_size=16 actor.sft_context_loss_weight=1.0 \
  "data.prompt_template=$O/prompt_template.txt" > "$OUT/logs/sft_cond.log" 2>&1
echo "== $(date -u +%T) SFT done"
# an SFT run's config has no env: give the copy the conditioned PPO run's, so evaluation tells it its alpha
rm -rf "$T" && cp -r "$OUT/sft_cond" "$T" && rm -rf "$T/checkpoints"
python - "$T/run_config.yaml" "$REF/ppo_cond/hf/run_config.yaml" <<'PY'
import sys, yaml
sft, ppo = (yaml.safe_load(open(p)) for p in sys.argv[1:3])
sft["env"] = ppo["env"]
yaml.safe_dump(sft, open(sys.argv[1], "w"), sort_keys=False)
PY
for a in 0 0.3 0.6 0.9 0.15 0.45 0.7 0.8 1; do
  python -m router_r1.eval.evaluate --data "$REF/data/test.parquet" --pool "$POOL" --sim --greedy --checkpoint "$T" \
    --alpha "$a" --out "$E/cond_$a" > "$OUT/logs/eval_cond_$a.log" 2>&1
  echo "== $(date -u +%T) told $a: $(grep -o 'EM [0-9.]*, pool calls [0-9]*' "$OUT/logs/eval_cond_$a.log")"
done
for a in 0 0.3 0.6 0.9; do
  echo "# told $a minus fixed $a (the recorded 6-epoch SFT)"; python -m tools.analysis.paired_evals "$REF/eval6/fixed_$a" "$E/cond_$a" --routers
done > "$OUT/paired_vs_fixed.txt"
for a in 0.15 0.3 0.45 0.6 0.7 0.8 0.9 1; do
  echo "# told $a minus told 0"; python -m tools.analysis.paired_evals "$E/cond_0" "$E/cond_$a" --routers
done > "$OUT/paired_vs_told0.txt"
python -m router_r1.eval.report "$REF"/eval6/fixed_*/summary.json "$E"/cond_*/summary.json "$REF/eval6/baselines/summary.json" \
  --out "$OUT/pareto.png" > "$OUT/table.txt"
echo "== $(date -u +%T) done"
