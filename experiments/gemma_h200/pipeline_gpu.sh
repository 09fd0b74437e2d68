#!/usr/bin/env bash
# The embedded pipeline at a scale the CPU cannot reach (one GPU): a ~270M-parameter Llama
# built from a config, supervised warm start on noisy oracle trajectories, then PPO against
# the simulated pool twice from the same warm start (alpha 0 and alpha $ALPHA, run side by
# side on the one GPU), then all three policies evaluated on the held-out test questions.
#
#   bash experiments/gemma_h200/pipeline_gpu.sh                  # defaults below; outputs under $OUT
#   STEPS=5 N_ORACLE=200 MODEL='{...}' DEVICE=cpu bash experiments/gemma_h200/pipeline_gpu.sh   # a smoke run
#   MODEL=/models/gemma-3-270m.gguf TOKENIZER=/models/gemma-3-tok bash experiments/gemma_h200/pipeline_gpu.sh
#       # a pretrained start: its own tokenizer (a GGUF's, or the directory tools/convert/save_gguf_tokenizer.py
#       # wrote); hf_static covers Llama, Qwen2 and Gemma 3, ROLLOUT=hf the rest
#   IN_FLIGHT=0 bash experiments/gemma_h200/pipeline_gpu.sh      # sync on-policy rollouts, as every record made before
#       # issue 30 ran; the default streams 2x the batch (docs/results/h200/streaming: 2.9x the steps per hour)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
OUT=${OUT:-outputs/gpu_pipeline}
DEVICE=${DEVICE:-cuda}
N_ORACLE=${N_ORACLE:-4000}
WORLD_ENTITIES=${WORLD_ENTITIES:-150}  # entities per type; 150 holds ~2,000 one-hop train questions
ORACLE_FLAGS=${ORACLE_FLAGS:---noise 0.3}
SFT_EPOCHS=${SFT_EPOCHS:-3}
SFT_LR=${SFT_LR:-3e-4}
SFT_BATCH=${SFT_BATCH:-32}
SFT_TIME_LIMIT=${SFT_TIME_LIMIT:-}   # seconds; the SFT stage stops there and saves (empty: none)
SFT_CONTEXT_LOSS=${SFT_CONTEXT_LOSS:-1.0}  # loss weight of prompt and <information> tokens in SFT (0: the policy's only;
                                           # a pretrained start needs no help to read, and its few decision tokens weigh more)
TOKENIZER=${TOKENIZER:-}              # empty: the BPE that the oracle stage trains
ROLLOUT=${ROLLOUT:-hf_static}
PPO_FLAGS=${PPO_FLAGS:-}             # extra hydra overrides for both PPO runs (e.g. env.schedule=sync)
STEPS=${STEPS:-60}
ACTOR_LR=${ACTOR_LR:-2e-5}
ALPHA=${ALPHA:-0.6}
ALPHAS=${ALPHAS:-0 $ALPHA}   # one PPO run per alpha, side by side from the same warm start (one alone gets the whole GPU)
# The GPU recipe's own sampling temperature: configs/embedded.yaml's 0.5 was measured for the embedded policy only;
# from Gemma's warm start at 0.5 the alpha-0 run fell apart at step 18 (docs/results/h200/pipeline_gemma_s10)
TEMPERATURE=${TEMPERATURE:-0.7}
BATCH=${BATCH:-64}
MICRO=${MICRO:-$((BATCH / 2))}   # rows per forward/backward in the updates (on an 80 GB card 32 ran out of memory with two runs side by side, 8 fitted)
IN_FLIGHT=${IN_FLIGHT:-$((BATCH * 2))}   # rollout.in_flight: prompts in play, streaming (0: sync on-policy)
EVAL_LIMIT=${EVAL_LIMIT:-500}
MODEL=${MODEL:-'{"model_type": "llama", "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 4, "max_position_embeddings": 2048, "tie_word_embeddings": true, "rope_theta": 10000.0}'}
export TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT"
start=$(date +%s)
stage() { echo; echo "== [$(( $(date +%s) - start ))s] $*"; }

stage "oracle trajectories, tokenizer; QA data"
$PY -m sim.warm_start --out-dir "$OUT/oracle" --n "$N_ORACLE" --world-entities "$WORLD_ENTITIES" $ORACLE_FLAGS --report
$PY -m sim.qa --out-dir "$OUT/data" --prompt-template "$OUT/oracle/prompt_template.txt" --world-entities "$WORLD_ENTITIES" \
  --train-size 2000 --val-size 200 --test-size "$EVAL_LIMIT"

stage "supervised warm start"
$PY -m verl.trainer.sft --data "$OUT/oracle/oracle.parquet" --model "$MODEL" --tokenizer "${TOKENIZER:-$OUT/oracle/tokenizer}" \
  --out "$OUT/sft" --epochs "$SFT_EPOCHS" --lr "$SFT_LR" --batch-size "$SFT_BATCH" --context-loss-weight "$SFT_CONTEXT_LOSS" \
  --device "$DEVICE" ${SFT_TIME_LIMIT:+--time-limit-s $SFT_TIME_LIMIT} --prompt-template "$OUT/oracle/prompt_template.txt"

stage "simulated pool server"
source tools/sim_pool.sh
start_sim_pool "$OUT/pool_server.log" --world-entities "$WORLD_ENTITIES"

stage "PPO at alpha $ALPHAS, side by side"
ppo() {  # $1 = alpha, $2 = output dir
  $PY -m verl.trainer.main_ppo --config-name embedded \
    "data.train_files=[$OUT/data/train.parquet]" "data.val_files=[$OUT/data/val.parquet]" \
    data.train_batch_size="$BATCH" data.val_batch_size=200 \
    "model.path=$OUT/sft" "model.tokenizer=$OUT/sft" model.dtype=auto trainer.device="$DEVICE" \
    "data.prompt_template=$OUT/oracle/prompt_template.txt" \
    rollout.name="$ROLLOUT" rollout.max_batch_size=$((IN_FLIGHT > 2 * BATCH ? IN_FLIGHT : 2 * BATCH)) \
    rollout.in_flight="$IN_FLIGHT" trainer.max_staleness=1 \
    actor.lr="$ACTOR_LR" actor.ppo_mini_batch_size=$((BATCH / 2)) actor.ppo_micro_batch_size="$MICRO" \
    critic.lr=1e-4 critic.ppo_mini_batch_size=$((BATCH / 2)) critic.ppo_micro_batch_size="$MICRO" \
    rollout.temperature="$TEMPERATURE" \
    env.pool_url="$URL" env.alpha="$1" trainer.total_steps="$STEPS" trainer.test_freq=10 trainer.dump_rollouts=8 \
    trainer.output_dir="$2" trainer.experiment_name="gpu_alpha$1" $PPO_FLAGS > "$2.log" 2>&1
}
declare -A RUNS=()   # pid -> its output dir
for a in $ALPHAS; do
  ppo "$a" "$OUT/ppo_alpha$a" & RUNS[$!]="$OUT/ppo_alpha$a"
done
for pid in "${!RUNS[@]}"; do wait "$pid" || { tail -30 "${RUNS[$pid]}.log"; exit 1; }; done
CKPTS=(--checkpoint "$OUT/sft")
for a in $ALPHAS; do CKPTS+=(--checkpoint "$OUT/ppo_alpha$a/hf"); done

stage "evaluation on $EVAL_LIMIT test questions (greedy)"
# turns and lengths: the runs' own (their hf/run_config.yaml); one reward column for the three: alpha 0
$PY -m router_r1.eval.evaluate --data "$OUT/data/test.parquet" --pool configs/pool/sim.yaml --pool-url "$URL" \
  --greedy --alpha 0 --device "$DEVICE" --rollout "$ROLLOUT" \
  --batch-size 256 "${CKPTS[@]}" \
  --out "$OUT/eval"
stage "done"
