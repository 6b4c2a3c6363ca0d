#!/usr/bin/env bash
# The bad-input corpus: runs every case of tests/bad_input/cases.txt (from the repo root) and
# checks its exit code, that the first line on stderr contains the expected text (the culprit:
# key, file, variable, value), that at most one line is a dtr error line, and that nothing
# crashed or leaked library internals.
#   run.sh BIN_DIR [MPIRUN] [NAME_REGEX]
set -uo pipefail
BIN="$1"; MPIRUN="${2:-mpirun}"; ONLY="${3:-}"
ROOT_FLAG=""; [ "$(id -u)" -eq 0 ] && ROOT_FLAG="--allow-run-as-root"
export TRAIN="$BIN/dtr-train" GEN="$BIN/dtr-generate" CONV="$BIN/dtr-convert"
export MPI="$MPIRUN --oversubscribe $ROOT_FLAG --mca btl self,vader,tcp --bind-to none"
OUT=out/bad_input
export FIX=$OUT/fix
bash tests/bad_input/make_fixtures.sh "$FIX" "$TRAIN" || { echo "FAIL: fixtures (see $FIX/ck.log)"; exit 1; }
# Signs of a crash or of internals reaching the user.
CRASH='terminate called|Segmentation fault|core dumped|Aborted|free\(\): |double free|std::|basic_string|basic_filebuf|yaml-cpp|invalid node|bad_alloc|what\(\)'
n=0; bad=0; start=$(date +%s)
while IFS='|' read -r name code expect cmd; do
  name=$(sed 's/^ *//; s/ *$//' <<<"$name")
  { [ -z "$name" ] || [ "${name:0:1}" = "#" ]; } && continue
  [ -n "$ONLY" ] && ! [[ "$name" =~ $ONLY ]] && continue
  code=$(sed 's/ //g' <<<"$code"); expect=$(echo "$expect" | sed 's/^ *//; s/ *$//'); cmd=$(echo "$cmd" | sed 's/^ *//')
  export W=$OUT/work/$name
  rm -rf "$W" && mkdir -p "$W"
  export CI="$TRAIN --config configs/ci/single.yaml --progress lines --set checkpoint.checkpoint_dir=$W/o"
  expect=${expect//\$FIX/$FIX}; expect=${expect//\$W/$W}  # $FIX / $W in the expected text
  timeout 120 bash -c "$cmd" < /dev/null > "$W/stdout" 2> "$W/stderr"  # mpirun would eat the table
  rc=$?
  first=$(grep -v '^[[:space:]]*$' "$W/stderr" | head -1)
  why=""
  [ "$rc" = "$code" ] || why="exit code $rc, expected $code"
  [ -z "$why" ] && ! grep -qF -- "$expect" <<<"$first" && why="first stderr line lacks '$expect'"
  [ -z "$why" ] && [ "$(grep -cE '(^|\] )dtr-[a-z]+: error:' "$W/stderr")" -gt 1 ] && why="more than one error line"
  [ -z "$why" ] && grep -qE "$CRASH" "$W/stderr" && why="crash or internals: $(grep -m1 -E "$CRASH" "$W/stderr")"
  n=$((n + 1))
  if [ -n "$why" ]; then
    bad=$((bad + 1))
    echo "FAIL $name: $why"
    echo "  command: $cmd"
    echo "  first stderr line: $first"
  else
    echo "ok   $name: $first" | cut -c1-200
  fi
done < tests/bad_input/cases.txt
echo "bad-input corpus: $n cases, $bad failed, $(( $(date +%s) - start )) s"
[ "$n" -gt 0 ] && [ "$bad" -eq 0 ]
