# The GRPO router that the AdaTurn runs reuse (outputs/grpo), as run in the first round of the
# embedded default (train.sh as of 1efb28d; this file lived in docs/results/embedded_cpu/ until 8ed743f, then docs/results/adaturn_cpu/).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH=/work/venv/bin:$PATH OMP_NUM_THREADS=2
OUT=outputs/embedded
PY=python
source tools/sim_pool.sh
start_sim_pool /tmp/alpha_server.log
python -m verl.trainer.main_ppo --config-name embedded "data.train_files=[$OUT/data/train.parquet]" "data.val_files=[$OUT/data/val.parquet]" \
  model.path=$OUT/sft model.tokenizer=$OUT/sft env.pool_url=$URL trainer.output_dir=outputs/embedded_grpo env.alpha=0.0 trainer.experiment_name=grpo algorithm.adv_estimator=grpo rollout.n=4 data.train_batch_size=16 actor.ppo_mini_batch_size=64 actor.ppo_micro_batch_size=32 algorithm.use_kl_in_reward=false critic.enable=false trainer.total_steps=40
cp $OUT/oracle/prompt_template.txt outputs/embedded_grpo/hf/prompt_template.txt
rm -rf outputs/grpo; cp -r outputs/embedded_grpo/hf outputs/grpo
python -m router_r1.eval.evaluate --data $OUT/data/test.parquet --pool configs/pool/sim.yaml --pool-url $URL --greedy --max-turns 3 \
  --max-obs-length 128 --response-length 64 --max-response-length 512  \
  --checkpoint outputs/grpo --out outputs/eval_grpo
