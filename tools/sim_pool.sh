# Source me: `start_sim_pool LOG [server flags...]` starts the simulated pool server on a free loopback port,
# waits until it listens, sets URL to its /v1 endpoint and stops it when the script exits.
# Uses $PY (the python to run), the pool yaml $POOL (default configs/pool/sim.yaml) and the world of seed
# $WORLD_SEED (default 0), as train.sh sets them; latency 0 (answers at once). Flags given override these.
start_sim_pool() {
  local log=$1; shift
  $PY -m router_r1.pool.server --backend sim --pool "${POOL:-configs/pool/sim.yaml}" --seed "${WORLD_SEED:-0}" \
    --port 0 --latency-scale 0 "$@" >"$log" 2>&1 &
  SIM_POOL_PID=$!
  trap 'kill $SIM_POOL_PID 2>/dev/null || true' EXIT
  for _ in $(seq 100); do grep -q "listening on" "$log" 2>/dev/null && break; sleep 0.2; done
  URL=$(grep -o "http://[^ ]*/v1" "$log" | head -1)
  [ -n "$URL" ] || { echo "pool server did not start; see $log" >&2; exit 1; }
}
