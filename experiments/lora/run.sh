#!/usr/bin/env bash
# LoRA vs full fine-tuning on the embedded default (CPU), one warm start, one seed each.

set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHON=python OMP_NUM_THREADS=1
R=${R:-/tmp/lora_cpu}
mkdir -p $R
OUT=$R/sft SFT_ONLY=1 bash train.sh > $R/sft.log 2>&1
OUT=$R/full SFT_FROM=$R/sft EVAL_LIMIT=100 bash train.sh trainer.total_steps=20 > $R/full.log 2>&1
OUT=$R/lora SFT_FROM=$R/sft EVAL_LIMIT=100 bash train.sh trainer.total_steps=20 actor.lora.rank=16 actor.lora.alpha=32 \
  actor.lr=1e-3 > $R/lora.log 2>&1
echo done > $R/DONE
