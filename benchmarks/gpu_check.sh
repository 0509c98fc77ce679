#!/usr/bin/env bash
# The GPU check, in one call on a lent GPU machine: run from the repository root, with the
# package on PYTHONPATH (that machine's python3 has torch, Triton, nvidia-ml-py and the rest;
# nothing can be installed there). Each step has its own time limit out of one deadline, so a
# step that hangs costs its own minutes, not the others'; every file it writes lands in $OUT as
# it goes (results.tgz, repacked after each step).
#
#   OUT=/tmp/gpu DEADLINE=540 bash benchmarks/gpu_check.sh
#
# Steps, most needed first: environment; a smoke sweep of each timer, and of the serial
# executor beside the default fork server (the script stops if the default one fails at once);
# the `cuda` tests; the energy counter (benchmarks/energy_check.py, a sweep with --energy); compiled layers beside eager ones (--compile default, and reduce-overhead's
# CUDA graphs); the auto grid (the GPU's default) with the clocks on record; the intervals'
# coverage across invocations; the three timers against torch.utils.benchmark and Triton;
# `ab` A/A up to five times, then attention against attention-sdpa; generation (--mode decode,
# auto); the same cases timed in fresh processes (their spread); `attnbench machine`; a grid
# under the kernels timer.
set -u
OUT=${OUT:?set OUT to the folder the results go to}
DEADLINE=${DEADLINE:-540}
STEPS=${STEPS:-env,smoke,tests,energy,compile,auto,coverage,agreement,ab,decode,spread,machine,kernels}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MPLBACKEND=Agg ATTNBENCH_CACHE_DIR=/tmp/abcache
# A lent VM's host read disturbed in 58 of 72 rounds on 2026-11-30, and the first smoke sweep
# spent its minute waiting for quiet: the script's sweeps do not wait unless asked.
export ATTNBENCH_WAIT_QUIET=${ATTNBENCH_WAIT_QUIET:-0}
PY=${PY:-python3}
DEV=${DEV:-cuda}
R=/tmp/results
mkdir -p "$R" "$OUT"
T0=$SECONDS
LOG=$OUT/log.txt

left() { echo $((DEADLINE - (SECONDS - T0))); }
want() { [[ ",$STEPS," == *",$1,"* ]]; }
pack() { tar czf "$OUT/results.tgz" -C "$R" . 2>/dev/null; }
# step NAME LIMIT COMMAND...: runs COMMAND for at most LIMIT seconds (less if the deadline is
# nearer), logging its output and its time; skipped when under 20 s remain.
step() {
  local name=$1 limit=$2; shift 2
  want "${name%%-*}" || [[ $name == cost ]] || return 0  # smoke-kernels runs with smoke
  local room; room=$(left)
  (( room < 20 )) && { echo "== $name: skipped, ${room}s left" | tee -a "$LOG"; return 1; }
  (( limit > room )) && limit=$room
  echo "== $name (limit ${limit}s, $(left)s left)" | tee -a "$LOG"
  local start=$SECONDS
  timeout -k 5 "$limit" "$@" 2>&1 | tee -a "$LOG" | tail -n 30
  local rc=${PIPESTATUS[0]}
  echo "== $name: rc=$rc in $((SECONDS - start))s" | tee -a "$LOG"
  pack
  return "$rc"
}

if want env; then
  {
    nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv
    $PY -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.get_device_name(), torch.cuda.get_device_properties(0))"
    $PY -c "import triton, pynvml; print('triton', triton.__version__, 'pynvml', pynvml.__file__)"
    nproc
  } 2>&1 | tee -a "$LOG"
fi

AB="$PY -m attnbench"
if want smoke; then
  export ATTNBENCH_DEBUG=1  # a traceback, not one line: the smoke is there to show what broke
  step cost 40 $PY benchmarks/cuda_process_cost.py --forks 4 --device $DEV
  ATTNBENCH_TRACE_FORK=$R/trace.txt step smoke ${SMOKE_LIMIT:-40} $AB sweep --device $DEV --layers conv,attention-sdpa,lstm \
    --n 64,128 --d 32 --time-budget 0.02 --no-charts --out $R/smoke \
    || { echo "smoke failed: stopping here" | tee -a "$LOG"; exit 1; }
  step smoke-serial 40 $AB sweep --device $DEV --layers conv,attention-sdpa,lstm \
    --n 64,128 --d 32 --time-budget 0.02 --no-charts --executor serial --out $R/smoke-serial
  for timer in ${SMOKE_TIMERS-kernels cold}; do
    step smoke-$timer 25 $AB sweep --device $DEV --layers conv,attention-sdpa,lstm,ssm \
      --n 64,128 --d 32 --time-budget 0.02 --no-charts --timer $timer --out $R/smoke-$timer
  done
  $PY -c "import pandas as pd
import json
for t in ('smoke', 'smoke-serial', 'smoke-kernels', 'smoke-cold'):
    try:
        f = pd.read_csv('$R/' + t + '/results.csv')
        d = json.load(open('$R/' + t + '/run.json')).get('duration_s')
    except OSError as e:
        print(t, e); continue
    print(t, 'duration_s', d)
    print(f[['layer', 'n', 'status', 'time_s', 'time_ci_low_s', 'time_ci_high_s', 'kernel_share', 'sm_clock_mhz', 'wall_s']].to_string())
" 2>&1 | tee -a "$LOG" | tail -n 30
  unset ATTNBENCH_DEBUG
fi

step tests ${TESTS_LIMIT:-120} $PY -m pytest -q -n 0 -m cuda -p no:cacheprovider -rfE -k "not test_ab_a_against_a" tests/test_cuda.py

# energy: the counter's step, a pass against one six times longer and NVML's power, the sum;
# then a sweep with --energy (every case's row)
step energy ${ENERGY_LIMIT:-60} $PY benchmarks/energy_check.py --device $DEV --json $R/energy.json
step energy-sweep ${ENERGY_SWEEP_LIMIT:-60} $AB sweep --device $DEV --energy \
  --layers ${EL:-conv,lstm,attention,attention-sdpa} --n ${EN:-256,1024,4096} --d 128 \
  --time-budget 0.1 --no-charts --out $R/gpu-energy
if want energy; then
  $PY -c "import pandas as pd
f = pd.read_csv('$R/gpu-energy/results.csv')
print(f[['layer', 'n', 'status', 'time_s', 'energy_j', 'power_w', 'energy_method']].to_string())
" 2>&1 | tee -a "$LOG" | tail -n 20
fi

# compiled layers beside eager ones, one grid; then reduce-overhead (CUDA graphs) on two layers
CL=${CL:-conv,rnn,lstm,attention,attention-sdpa,attention-linear,ssm}
CN=${CN:-256,1024,4096}
step compile ${COMPILE_LIMIT:-130} $AB sweep --device $DEV --compile default --layers $CL \
  --n $CN --d 64 --time-budget 0.1 --no-charts --out $R/gpu-compile
step compile-eager 40 $AB sweep --device $DEV --layers $CL \
  --n $CN --d 64 --time-budget 0.1 --no-charts --out $R/gpu-compile-eager
step compile-graphs 45 $AB sweep --device $DEV --compile reduce-overhead \
  --layers attention,attention-linear --n ${CN%%,*},${CN##*,} --d 64 --time-budget 0.1 --no-charts \
  --out $R/gpu-compile-graphs
step compile-kernels 30 $AB sweep --device $DEV --compile reduce-overhead --timer kernels \
  --layers attention --n 256 --d 64 --time-budget 0.05 --no-charts --out $R/gpu-compile-kernels
if want compile; then
  $PY -c "import pandas as pd
for t in ('gpu-compile', 'gpu-compile-eager', 'gpu-compile-graphs', 'gpu-compile-kernels'):
    try:
        f = pd.read_csv('$R/' + t + '/results.csv')
    except OSError as e:
        print(t, e); continue
    cols = [c for c in ('layer', 'n', 'status', 'time_s', 'kernel_share', 'peak_bytes', 'seq_steps', 'fused_path', 'compile_s', 'compile_cache', 'compile_breaks', 'compile_check', 'error') if c in f]
    print(t); print(f[cols].to_string())
" 2>&1 | tee -a "$LOG" | tail -n 60
fi

step auto ${AUTO_LIMIT:-175} $AB sweep --device $DEV --auto-budget ${AUTO_BUDGET:-120} --out $R/gpu-auto
step coverage ${COVERAGE_LIMIT:-150} $PY benchmarks/coverage.py --device $DEV --invocations ${INVOCATIONS:-4} \
  --n ${COVN:-512,2048} --keep $R/coverage

step agreement 130 $PY benchmarks/gpu_agreement.py --device $DEV --n 256,2048 --d 128 \
  --budget 0.15 --json $R/agreement.json

if want ab; then
  # A/A on AB_LAYERS at AB_N, AB_RUNS times (as the time left allows), each pair two fresh
  # processes; then attention-sdpa -> attention, which must exit 1
  AB_END=$((SECONDS + ${AB_LIMIT:-300}))
  for i in $(seq 1 ${AB_RUNS:-5}); do
    (( $(left) < 60 || AB_END - SECONDS < 30 )) && break
    start=$SECONDS
    timeout -k 5 ${AB_ONE:-75} $AB ab --device $DEV --layers ${AB_LAYERS:-conv,rnn,attention} \
      --n ${AB_N:-256,2048} --d 64 --time-budget 0.1 ${AB_ARGS:---processes 5 --alpha 0.05} \
      --json --quiet --out $R/ab-aa-$i \
      > "$R/ab-aa-$i.json" 2>> "$LOG"
    echo "== ab A/A $i: exit $? in $((SECONDS - start))s" | tee -a "$LOG"
  done
  start=$SECONDS
  timeout -k 5 ${AB_ONE:-75} $AB ab --device $DEV --base-layers attention-sdpa --layers attention \
    --n 4096 --d 128 --time-budget 0.1 ${AB_ARGS:---processes 5 --alpha 0.05} --json --quiet \
    --out $R/ab-sdpa \
    > "$R/ab-sdpa.json" 2>> "$LOG"
  echo "== ab attention-sdpa -> attention at n = 4096: exit $? in $((SECONDS - start))s" | tee -a "$LOG"
  $PY - "$R" <<'EOF' 2>&1 | tee -a "$LOG"
import glob, json, sys
for path in sorted(glob.glob(sys.argv[1] + "/ab-*.json")):
    try:
        data = json.load(open(path))
    except ValueError:
        print(path, "unreadable"); continue
    o = data["overall"]["raw"]
    cases = " ".join(f"{c['layer'].split(' ')[0][:6]}@{c['n']}:{c['ratio_judged'] or 0:.3f}/"
                     f"{c['clock_ratio'] or 0:.3f}/{c['verdict'][:5]}" for c in data["cases"])
    import math
    raw = [c["ratio"] for c in data["cases"] if c["ratio"]]
    pooled = math.exp(sum(map(math.log, raw)) / len(raw)) if raw else float("nan")
    print(path.rsplit("/", 1)[1], f"overall {o['ratio']:.3f} p={o['p_value']} {o['verdict']}",
          f"(pooled medians {pooled:.3f});", cases)
EOF
  pack
fi

# the default on a GPU is --n auto: every layer doubles n until its time grows as its work
step gaps 45 $PY benchmarks/timer_gaps.py
step splittests 60 $PY -m pytest -q -n 0 -m cuda -p no:cacheprovider -rfE -k \
  "kernels_share or splits_its_time or captured or kernels_timer or cold_timer or sm_clock" \
  tests/test_cuda.py
# generation: every layer one token at a time, each doubled until its step's rate settles
step decode ${DECODE_LIMIT:-120} $AB sweep --device $DEV --mode decode --n auto \
  --auto-budget ${DECODE_BUDGET:-90} --out $R/gpu-decode
step spread 45 $PY benchmarks/process_spread.py --device $DEV --processes 4
step machine 50 bash -c "$AB machine --device $DEV --json > $R/machine-float32.json && \
  head -c 400 $R/machine-float32.json"
step kernels 90 $AB sweep --device $DEV --timer kernels --n 256..4096 --d 128 \
  --time-budget 0.1 --out $R/gpu-kernels
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv | tee -a "$LOG"
echo "done in $((SECONDS - T0))s" | tee -a "$LOG"
pack
