#!/usr/bin/env bash
# (run from the repository root, after `SFT_EPOCHS=3 PPO_STEPS=16 bash experiments/alpha_tradeoff/run_tradeoff.sh` wrote
# its SFTs) continue the conditioned SFT to 6 epochs, evaluate it told each alpha, the baselines, then continue and
# evaluate the fixed SFTs (alpha 0.9, 0, 0.3, 0.6 in that order)
set -uo pipefail
O=outputs/alpha_tradeoff; E=$O/eval6; POOL=configs/pool/sim_tradeoff.yaml
export OMP_NUM_THREADS=2 TOKENIZERS_PARALLELISM=false
bash experiments/alpha_tradeoff/continue_sft.sh sft_cond $O/oracle  # (in the session it ran alone first)
echo "== $(date -u +%T) cond SFT done"
# the SFT run's config has env: null, so evaluation would prompt it without the alpha sentence it was trained on;
# a copy whose run_config carries the conditioned PPO run's env (env.alphas) is told its alpha as in training
T=$O/sft_cond_6ep_told; rm -rf $T; mkdir -p $T
cp $O/sft_cond_6ep/{config.json,generation_config.json,model.safetensors,tokenizer.json,tokenizer_config.json,chat_template.jinja,prompt_template.txt} $T/
python - "$O/sft_cond_6ep/run_config.yaml" "$O/ppo_cond/hf/run_config.yaml" "$T/run_config.yaml" <<'PY'
import sys, yaml
sft, ppo = (yaml.safe_load(open(p)) for p in sys.argv[1:3])
sft["env"] = ppo["env"]
yaml.safe_dump(sft, open(sys.argv[3], "w"), sort_keys=False)
PY
ev() { python -m router_r1.eval.evaluate --data $O/data/test.parquet --pool $POOL --sim --greedy --out "$E/$1" "${@:2}" > $O/logs/eval6_$1.log 2>&1; echo "== $(date -u +%T) eval $1 rc=$?"; }
for a in 0 0.9 0.3 0.6 0.15 0.45 0.7 0.8 1; do ev cond_$a --checkpoint $T --alpha $a; done
B=(); for b in all; do B+=(--baseline $b); done
ev baselines --alpha 0 "${B[@]}" --train-data $O/data/train.parquet
for a in 0.9 0 0.3 0.6; do
  bash experiments/alpha_tradeoff/continue_sft.sh sft_fixed_$a $O/oracle_fixed_$a; echo "== $(date -u +%T) fixed $a SFT done"
  ev fixed_$a --checkpoint $O/sft_fixed_${a}_6ep
done
echo "== $(date -u +%T) chain done"
