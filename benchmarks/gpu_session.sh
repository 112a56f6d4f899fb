#!/usr/bin/env bash
# One lease of a GPU machine, as one command: versions, the differential check of every kernel
# family (gpu_check.py, in SHARDS processes: Triton compiles each variant in its own process),
# then the timings (gpu.py --no-check).  Logs go to $OUT (at most a few files).
#
#   bash benchmarks/gpu_session.sh            # check, then time
#   ONLY="3-D gaussian" bash benchmarks/gpu_session.sh check   # a re-check of some cases
#   bash benchmarks/gpu_session.sh bench      # timings only
#
# CHECK_S / BENCH_S bound each phase (seconds); CHECK_ARGS adds gpu_check.py arguments; PY is
# the interpreter (default python3: the GPU image's, with torch and triton; PY=.venv/bin/python
# elsewhere); OUT the log folder (default /tmp/gpu_session).
set -u
what=${1:-all}
OUT=${OUT:-/tmp/gpu_session}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
PY=${PY:-python3}
t0=$(date +%s)
nvidia-smi -L
$PY -c "import torch, triton, numpy, scipy; print('torch', torch.__version__, 'triton', triton.__version__,
'numpy', numpy.__version__, 'scipy', scipy.__version__, torch.cuda.get_device_name(0))"

if [ "$what" = all ] || [ "$what" = check ]; then
    N=${SHARDS:-12}
    tmp=$(mktemp -d)
    for i in $(seq 0 $((N - 1))); do
        big=""
        [ "$i" = 0 ] && [ -z "${ONLY:-}" ] && big="--big"
        timeout "${CHECK_S:-240}" $PY benchmarks/gpu_check.py --shard "$i/$N" $big --only "${ONLY:-}" \
            --json "$tmp/check_$i.json" ${CHECK_ARGS:-} >"$tmp/check_$i.log" 2>&1 &
    done
    wait
    cat "$tmp"/check_*.log >"$OUT/check.log"
    $PY - "$tmp" "$OUT/check.json" <<'EOF'
import glob, json, sys
rows = []
for f in sorted(glob.glob(sys.argv[1] + "/check_*.json")):
    rows += json.load(open(f))
json.dump(rows, open(sys.argv[2], "w"), indent=1)
EOF
    echo "--- check: failures, errors and summaries ($(($(date +%s) - t0)) s)"
    grep -v "^ok " "$OUT/check.log" | grep -v "Warning\|warn(" | tail -80
    n_ok=$(grep -c '^ok ' "$OUT/check.log")
    echo "--- check: $n_ok ok, $(grep -c '^FAIL' "$OUT/check.log") FAIL"
    [ "$n_ok" = 0 ] && echo "--- check: NOTHING PASSED (no GPU? see $OUT/check.log)"
fi

if [ "$what" = all ] || [ "$what" = bench ]; then
    echo "--- timings ($(($(date +%s) - t0)) s)"
    timeout "${BENCH_S:-200}" $PY benchmarks/gpu.py --no-check ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
fi
echo "--- done in $(($(date +%s) - t0)) s"
