#!/usr/bin/env bash
# The GPU check, in one call on a lent GPU machine: run from the repository root, with the
# package on PYTHONPATH (that machine's python3 has torch, Triton and the rest; nothing can be
# installed there). Each step has its own time limit out of one deadline, so a step that hangs
# costs its own minutes, not the others'; every file it writes lands in $OUT as it goes.
#
#   OUT=/tmp/gpu DEADLINE=420 bash benchmarks/gpu_check.sh
#
# Steps: environment; a smoke sweep (the script stops there if the CUDA path fails at once);
# the `cuda` tests; `attnbench machine` at float32 and bfloat16; the default sweep (float32,
# forward; --n auto on a GPU) and its kernels' shares; the CPU's default grid; attnbench against do_bench and torch.utils.benchmark; a wide bfloat16 sweep; `ab`
# A/A up to five times; the default grid in train mode. Results are tarred into $OUT/results.tgz.
set -u
OUT=${OUT:?set OUT to the folder the results go to}
DEADLINE=${DEADLINE:-480}
STEPS=${STEPS:-env,smoke,tests,machine,default,split,fixed,agreement,wide,ab,train}
WIDE_LAYERS=${WIDE_LAYERS:-conv,rnn,attention,attention-sdpa,attention-linear,attention-local,ssm-scan}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MPLBACKEND=Agg ATTNBENCH_CACHE_DIR=/tmp/abcache
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
  want "$name" || return 0
  local room; room=$(left)
  (( room < 20 )) && { echo "== $name: skipped, ${room}s left" | tee -a "$LOG"; return 1; }
  (( limit > room )) && limit=$room
  echo "== $name (limit ${limit}s, $(left)s left)" | tee -a "$LOG"
  local start=$SECONDS
  timeout -k 5 "$limit" "$@" 2>&1 | tee -a "$LOG" | tail -n 40
  local rc=${PIPESTATUS[0]}
  echo "== $name: rc=$rc in $((SECONDS - start))s" | tee -a "$LOG"
  pack
  return "$rc"
}

if want env; then
  {
    nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv
    $PY -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.get_device_name(), torch.cuda.get_device_properties(0))"
    $PY -c "import triton; print('triton', triton.__version__)"
    $PY -m pip list 2>/dev/null | grep -i -E "^(typer|rich|pandas|matplotlib|scipy|numpy|pytest|hypothesis|jsonschema) "
  } 2>&1 | tee -a "$LOG"
fi

AB="$PY -m attnbench"
if want smoke; then
  export ATTNBENCH_DEBUG=1  # a traceback, not one line: the smoke is there to show what broke
  step smoke 60 $AB sweep --device $DEV --layers conv,attention-sdpa,lstm \
    --n 64,128 --d 32 --time-budget 0.02 --no-charts --out $R/smoke \
    || { echo "smoke failed: stopping here" | tee -a "$LOG"; exit 1; }
  unset ATTNBENCH_DEBUG
fi

step tests 120 $PY -m pytest -q -m cuda -p no:cacheprovider -rfE tests/test_cuda.py
step machine 60 bash -c "$AB machine --device $DEV --json > $OUT/machine-float32.json && \
  $AB machine --device $DEV --dtype bfloat16 --json > $OUT/machine-bfloat16.json && \
  cat $OUT/machine-float32.json | head -c 600"
# the default on a GPU is --n auto: every layer doubles n until its time grows as its work
step default 200 $AB sweep --device $DEV --auto-budget 170 --out $R/gpu-default
step split 20 $PY -c "import pandas as pd; f = pd.read_csv('$R/gpu-default/results.csv'); \
print(f[['layer', 'n', 'time_s', 'kernel_share']].to_string()); \
print('kernel_time_s > time_s:', int((f.kernel_time_s > f.time_s).sum()))"
step fixed 120 $AB sweep --device $DEV --n 64..1024 --out $R/gpu-fixed
step agreement 60 $PY benchmarks/gpu_agreement.py --device $DEV --n 256,4096 --d 128 \
  --json $OUT/agreement.json
step wide 120 $AB sweep --device $DEV --dtype bfloat16 --n 256..65536 --d 128 \
  --layers $WIDE_LAYERS --max-case-seconds 0.5 --time-budget 0.1 --yes --out $R/gpu-wide-bf16
if want ab; then
  for i in 1 2 3 4 5; do  # as many as the deadline leaves room for, up to 5
    (( $(left) < 45 )) && break
    timeout -k 5 40 $AB ab --device $DEV --layers conv,rnn,attention,attention-sdpa \
      --n 256,2048 --d 64 --time-budget 0.1 --json --quiet --out $R/ab-aa-$i \
      > "$R/ab-aa-$i.json" 2>> "$LOG"
    echo "== ab A/A $i: exit $?" | tee -a "$LOG"
  done
  pack
fi
step train 60 $AB sweep --device $DEV --mode train --time-budget 0.1 --out $R/gpu-default-train
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv | tee -a "$LOG"
echo "done in $((SECONDS - T0))s" | tee -a "$LOG"
