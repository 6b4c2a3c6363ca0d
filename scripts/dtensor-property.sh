#!/usr/bin/env bash
# Runs the DTensor randomized property test (tests/dtensor/test_property.cpp) with new seeds:
# every seed on 1, 2, 3 and 4 ranks, CASES cases each, and prints one summary line per run
# (passed / refused views / invalid chains / failed). Failing cases are printed with their seed,
# mesh, inputs, placements and chain; re-run one with DTR_PROPERTY_SEED=S DTR_PROPERTY_CASE=K.
# Usage: scripts/dtensor-property.sh [FIRST_SEED [SEEDS [CASES]]]   (defaults: time-based, 5, 400)
# Needs: build/tests/dtensor_test_property (ninja -C build tests/dtensor_test_property).
set -u
cd "$(dirname "$0")/.."
first=${1:-$(( $(date +%s) % 100000 + 1000 ))}
seeds=${2:-5}
cases=${3:-400}
bin=build/tests/dtensor_test_property
[ -x "$bin" ] || { echo "dtensor-property: $bin not built (ninja -C build tests/dtensor_test_property)" >&2; exit 2; }
failed=0
total=0
for s in $(seq "$first" $(( first + seeds - 1 ))); do
  for np in 1 2 3 4; do
    out=$(DTR_PROPERTY_SEED=$s DTR_PROPERTY_CASES=$cases OMP_NUM_THREADS=1 DTR_COMM_TIMEOUT_S=120 \
          mpirun --oversubscribe --allow-run-as-root -np "$np" --mca btl self,vader,tcp --bind-to none "$bin" 2>&1)
    rc=$?
    line=$(echo "$out" | grep -m1 '^property:')
    echo "${line:-property: world $np seed $s: no summary (rc $rc)}"
    total=$(( total + cases ))
    if [ $rc -ne 0 ]; then
      failed=$(( failed + 1 ))
      echo "$out" | grep -E '^  case |^  (forward|gradient|backward|no gradient|output)|FAILED' | head -40
    fi
  done
done
echo "dtensor-property: $total cases over seeds $first..$(( first + seeds - 1 )) x ranks 1-4; $failed runs with failures"
[ $failed -eq 0 ]
