#!/usr/bin/env bash
# usage: ppo_only.sh SRC_OUT RUN_DIR [overrides...]  (SRC_OUT has data/, sft/, oracle/)
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH=/work/venv/bin:$PATH OMP_NUM_THREADS=2 TOKENIZERS_PARALLELISM=false
SRC=$1; RUN=$2; shift 2
mkdir -p $RUN
PY=python
source tools/sim_pool.sh
start_sim_pool $RUN/server.log
start=$(date +%s)
python -m verl.trainer.main_ppo --config-name embedded "data.train_files=[$SRC/data/train.parquet]" "data.val_files=[$SRC/data/val.parquet]" \
  model.path=$SRC/sft model.tokenizer=$SRC/sft env.pool_url=$URL trainer.output_dir=$RUN/ppo "$@" 2>&1 | grep -v "HTTP Request" | grep -v "^\[step" > $RUN/ppo.log
echo "ppo wall $(( $(date +%s) - start ))s" >> $RUN/ppo.log
cp $SRC/oracle/prompt_template.txt $RUN/ppo/hf/prompt_template.txt
python -m router_r1.eval.evaluate --data $SRC/data/test.parquet --pool configs/pool/sim.yaml --pool-url $URL --greedy --max-turns 3 \
  --max-obs-length 128 --response-length 64 --max-response-length 512 ${EVAL_ALPHA:+--alpha $EVAL_ALPHA} \
  --checkpoint $RUN/ppo/hf --out $RUN/eval 2>&1 | grep -v "HTTP Request" > $RUN/eval.log
