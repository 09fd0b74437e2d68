#!/usr/bin/env bash
# Issue 46 item 4: the whole PPO pipeline (GAE + critic, reference, hf_static rollouts against the simulated pool
# at its realistic latency) at the Qwen2.5-3B shape with random weights on one GPU, once per schedule (sync, then
# streaming), then tokens/s/GPU in NeMo-RL's unit and the step's time split (summarize.py).
#
#   WORK=/tmp/p3b bash experiments/pipeline_3b/run.sh OUT  # one H200: TIME_BUDGET (500 s) + the summary; carry .whl
#   SHAPE=tiny DEVICE=cpu COMPILE=0 STEPS=3 BATCH=4 bash experiments/pipeline_3b/run.sh /tmp/p3b   # CPU smoke
#
# Results: OUT/<schedule>/metrics.jsonl and OUT/<schedule>.log per run, OUT/summary.md and summary.json,
# OUT/pool_server.log, OUT/gpu_memory.csv (nvidia-smi every second) and OUT/<schedule>/gpu_peak_mib.txt.
# A run stops at STEPS logged steps or at its share of the time budget, whichever comes first: its total_steps lies
# far beyond, so no step it plays is the last (a run's last step always validates and saves: ~75 GB of actor and
# critic state at 3B, more than the device's disk). WORK (default OUT) holds the data and WORK/model (the random
# weights, 6 GB at 3B, and the tokenizer); both are reused when present, so a second call on the same machine can
# run one schedule again (SCHEDULES=stream) and the summary then covers both.
set -uo pipefail
OUT=${1:?usage: run.sh OUT}
WORK=${WORK:-$OUT}
mkdir -p "$OUT" "$WORK"
OUT=$(cd "$OUT" && pwd) WORK=$(cd "$WORK" && pwd)  # the caller's folders, before the cd to the repository
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
SHAPE=${SHAPE:-qwen2.5-3b}        # qwen2.5-3b | qwen2.5-0.5b | tiny (experiments/pipeline_3b/build.py)
DEVICE=${DEVICE:-cuda}
COMPILE=${COMPILE:-1}             # model.compile and rollout.compile (1/0)
STEPS=${STEPS:-6}                 # steps per run at most; the summary skips the first SKIP (warm-up, compilation)
SKIP=${SKIP:-2}
SCHEDULES=${SCHEDULES:-sync stream}  # sync: env.schedule=sync (each turn waits for the batch's slowest pool call);
                                     # continuous: one coroutine per episode, batch by batch;
                                     # stream: continuous episodes, rollout.in_flight = 2x BATCH
BATCH=${BATCH:-64}                # prompts per step (rollout.n 1: one episode each)
TURN=${TURN:-128}                 # rollout.response_length: tokens per generated turn at most
MAX_RESPONSE=${MAX_RESPONSE:-512}  # rollout.max_response_length: all turns and <information> blocks
TURN_TOKENS=${TURN_TOKENS:-64}    # mean tokens of a random turn before its action token (build.py)
LATENCY=${LATENCY:-1}             # the pool server's --latency-scale (1: each expert's own latency profile)
TRAIN_TOKENS=${TRAIN_TOKENS:-16384}  # actor.max_tokens_per_micro_batch (packed rows; the critic's too)
LP_TOKENS=${LP_TOKENS:-32768}     # actor.log_prob_max_tokens_per_micro_batch (old/ref log-probs, values)
TIME_BUDGET=${TIME_BUDGET:-500}   # seconds for the whole script before the summary; the runs share what the
                                  # build leaves (a run that reaches STEPS early leaves its time to the next)
PPO_FLAGS=${PPO_FLAGS:-}          # extra hydra overrides for every run
N_ORACLE=${N_ORACLE:-300}         # oracle trajectories: only the tokenizer and the prompt template are used
TRAIN_SIZE=${TRAIN_SIZE:-2000}    # QA training questions
case $SHAPE in tiny) TURN_TOKENS=${TINY_TURN_TOKENS:-16} ;; esac  # a 4,096-id vocabulary: fewer action tokens fit
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}  # actor + critic + ref + KV: tight
start=$(date +%s)
stage() { echo; echo "== [$(( $(date +%s) - start ))s] $*"; }

if [ -d .whl ]; then  # a bare device image: hydra, omegaconf, openai and friends (experiments/streaming's wheels)
  if [ ! -f /tmp/site/.ok ]; then
    stage "wheels"
    $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && touch /tmp/site/.ok
  fi
  export PYTHONPATH=/tmp/site:$PWD
  # openai 3.57 imports httpx2, which the device image lacks: the same API as its httpx
  $PY -c "import httpx2" 2>/dev/null || echo 'import sys, httpx; sys.modules["httpx2"] = httpx' > /tmp/site/httpx2.py
fi
if [ "$DEVICE" != cpu ]; then
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
  nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader,nounits -l 1 >> "$OUT/gpu_memory.csv" 2>/dev/null &
  SMI_PID=$!
fi

if [ -f "$WORK/data/train.parquet" ] && [ -f "$WORK/oracle/prompt_template.txt" ]; then
  stage "tokenizer, prompt template and QA data: reusing $WORK/oracle, $WORK/data"
else
  stage "tokenizer, prompt template and QA data of the simulated world"
  $PY -m sim.warm_start --out-dir "$WORK/oracle" --n "$N_ORACLE" --world-entities 150 >"$WORK/build.log" 2>&1 &&
  $PY -m sim.qa --out-dir "$WORK/data" --prompt-template "$WORK/oracle/prompt_template.txt" --world-entities 150 \
    --train-size "$TRAIN_SIZE" --val-size 10 --test-size 10 >>"$WORK/build.log" 2>&1 ||
    { tail -20 "$WORK/build.log"; exit 1; }
fi

if grep -qs "\"shape\": \"$SHAPE\"" "$WORK/model/pipeline_3b.json" &&
   grep -qsE "\"turn_tokens\": $TURN_TOKENS(,|$)" "$WORK/model/pipeline_3b.json"; then
  stage "random-weight $SHAPE model (1 action id in $TURN_TOKENS): reusing $WORK/model"
else
  stage "random-weight $SHAPE model and its action tokenizer"
  $PY -m experiments.pipeline_3b.build --shape "$SHAPE" --base-tokenizer "$WORK/oracle/tokenizer" \
    --data "$WORK/data/train.parquet" --out "$WORK/model" --turn-tokens "$TURN_TOKENS" \
    --device "$([ "$DEVICE" = cpu ] && echo cpu || echo cuda)" || exit 1
fi
cp "$WORK/model/pipeline_3b.json" "$OUT/pipeline_3b.json"

stage "simulated pool server (latency x$LATENCY)"
source tools/sim_pool.sh
start_sim_pool "$OUT/pool_server.log" --latency-scale "$LATENCY" --world-entities 150
[ -n "${SMI_PID:-}" ] && trap 'kill $SIM_POOL_PID $SMI_PID 2>/dev/null || true' EXIT

# GAE + critic + reference (the embedded config's KL loss) on one process; gradient checkpointing and packed
# token-budget micro-batches keep the activations small beside two trained 3B models (README: memory)
ON=$([ "$COMPILE" = 1 ] && echo true || echo false)
PPO_COMMON=(--config-name embedded "data.train_files=[$WORK/data/train.parquet]" "data.val_files=[]"
  data.train_batch_size="$BATCH" "data.prompt_template=$WORK/oracle/prompt_template.txt"
  "model.path=$WORK/model" "model.tokenizer=$WORK/model" model.dtype=auto model.gradient_checkpointing=true
  model.compile="$ON" trainer.device="$DEVICE"
  rollout.name=hf_static rollout.compile="$ON" rollout.max_batch_size=$((2 * BATCH))
  rollout.response_length="$TURN" rollout.max_response_length="$MAX_RESPONSE"
  actor.use_remove_padding=true actor.max_tokens_per_micro_batch="$TRAIN_TOKENS"
  actor.log_prob_max_tokens_per_micro_batch="$LP_TOKENS"
  actor.ppo_mini_batch_size=$((BATCH / 2)) critic.ppo_mini_batch_size=$((BATCH / 2)) critic.warmup_steps=0
  "env.pool_url=$URL" trainer.total_steps=$((STEPS + 100)) trainer.test_freq=0 trainer.val_before_train=false
  trainer.save_freq=0 trainer.export_hf=false trainer.resume=none trainer.console_every=1 trainer.dump_rollouts=4)

ppo() {  # $1 = schedule name, $2 = seconds it may take, then extra overrides; stops at STEPS logged steps
  local name=$1 limit=$2; shift 2
  stage "PPO, $name (at most $STEPS steps or ${limit}s)"
  rm -rf "${OUT:?}/$name"
  mkdir -p "$OUT/$name"
  $PY -m verl.trainer.main_ppo "${PPO_COMMON[@]}" "trainer.output_dir=$OUT/$name" "trainer.experiment_name=$name" \
    "$@" $PPO_FLAGS > "$OUT/$name.log" 2>&1 &
  local pid=$! t0 rows=0 mem0=0
  t0=$(date +%s)
  [ -n "${SMI_PID:-}" ] && mem0=$(wc -l < "$OUT/gpu_memory.csv")
  while kill -0 "$pid" 2>/dev/null; do
    rows=$(grep -c '"timing/step"' "$OUT/$name/metrics.jsonl" 2>/dev/null || true)
    if [ "${rows:-0}" -ge "$STEPS" ] || [ $(( $(date +%s) - t0 )) -ge "$limit" ]; then
      kill "$pid" 2>/dev/null; break
    fi
    sleep 0.5
  done
  wait "$pid" 2>/dev/null
  rows=$(grep -c '"timing/step"' "$OUT/$name/metrics.jsonl" 2>/dev/null || true)
  echo "$name: ${rows:-0} of $STEPS steps logged in $(( $(date +%s) - t0 ))s"
  grep -E "^step [0-9]+/" "$OUT/$name.log" | tail -"$STEPS"
  [ "${rows:-0}" -ge "$STEPS" ] || tail -30 "$OUT/$name.log"
  if [ -n "${SMI_PID:-}" ]; then  # the run's peak GPU memory (MiB), from the samples taken while it ran
    tail -n +$((mem0 + 1)) "$OUT/gpu_memory.csv" | awk -F', ' '$2 > m {m = $2} END {print m + 0}' \
      > "$OUT/$name/gpu_peak_mib.txt"
  fi
}

set -- $SCHEDULES
left=$#
for schedule in $SCHEDULES; do
  limit=$(( (TIME_BUDGET - ($(date +%s) - start) - 10) / left ))
  left=$((left - 1))
  [ "$limit" -gt 30 ] || { echo "no time left for $schedule (TIME_BUDGET=$TIME_BUDGET)"; continue; }
  case $schedule in
    sync) ppo sync "$limit" env.schedule=sync ;;
    continuous) ppo continuous "$limit" env.schedule=continuous ;;
    stream) ppo stream "$limit" env.schedule=continuous rollout.in_flight=$((2 * BATCH)) trainer.max_staleness=1 ;;
    *) echo "SCHEDULES: unknown $schedule (sync | continuous | stream)" >&2; exit 2 ;;
  esac
done

stage "summary"
runs=$(for r in sync continuous stream; do
  case " $SCHEDULES " in *" $r "*) echo "$r" ;; *) [ -f "$OUT/$r/metrics.jsonl" ] && echo "$r" ;; esac
done)  # this call's runs and those an earlier call left in OUT
$PY -m experiments.pipeline_3b.summarize "$OUT" --runs $runs --skip "$SKIP" --steps "$STEPS"
rc=$?
stage "done"
exit $rc
