#!/usr/bin/env bash
# (run from the repository root, after continue_and_eval.sh) PPO from the 6-epoch warm starts, run_alpha.sh's recipe and
# the same PPO_STEPS for all five: conditioned (env.alphas=[0,0.3,0.6,0.9], algorithm.whiten_by=alpha) and one run at
# each fixed alpha; then the greedy evaluations (outputs/alpha_tradeoff/eval6p) of the four fixed runs and of the
# conditioned one told each of nine alphas
set -euo pipefail
O=outputs/alpha_tradeoff; E=$O/eval6p; POOL=configs/pool/sim_tradeoff.yaml; PPO_STEPS=${PPO_STEPS:-24}
export PY=python OMP_NUM_THREADS=2 TOKENIZERS_PARALLELISM=false
source tools/sim_pool.sh
start_sim_pool "$O/logs/pool_server6.log" --pool "$POOL"
ppo() {  # $1 run name, $2 warm start, then overrides (run_alpha.sh's ppo())
  python -m verl.trainer.main_ppo --config-name embedded "data.train_files=[$O/data/train.parquet]" \
    "data.val_files=[$O/data/val.parquet]" "model.path=$2" "model.tokenizer=$2" "env.pool=$POOL" "env.pool_url=$URL" \
    "trainer.output_dir=$O/$1" trainer.resume=none trainer.total_steps="$PPO_STEPS" \
    "data.prompt_template=$O/oracle/prompt_template.txt" trainer.experiment_name="$1" "${@:3}" > "$O/logs/$1.log" 2>&1
  echo "== $(date -u +%T) $1 done"
}
ev() { python -m router_r1.eval.evaluate --data $O/data/test.parquet --pool $POOL --sim --greedy --out "$E/$1" "${@:2}" \
  > $O/logs/eval6p_$1.log 2>&1; echo "== $(date -u +%T) eval $1"; }
ppo ppo6_cond $O/sft_cond_6ep "env.alphas=[0,0.3,0.6,0.9]" algorithm.whiten_by=alpha
for a in 0 0.9 0.3 0.6; do ppo ppo6_fixed_$a $O/sft_fixed_${a}_6ep "env.alpha=$a"; done
for a in 0 0.3 0.6 0.9 0.15 0.45 0.7 0.8 1; do ev cond_$a --checkpoint $O/ppo6_cond/hf --alpha $a; done
for a in 0 0.3 0.6 0.9; do ev fixed_$a --checkpoint $O/ppo6_fixed_$a/hf; done
