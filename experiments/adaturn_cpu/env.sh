# Sourced by the AdaTurn scripts here: the repository root as working directory, the python ($PY), one thread
# per process, the embedded default's outputs they start from ($EMB) and start_sim_pool (tools/sim_pool.sh).
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PY=${PYTHON:-/work/venv/bin/python}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} TOKENIZERS_PARALLELISM=false
EMB=outputs/embedded
source tools/sim_pool.sh
