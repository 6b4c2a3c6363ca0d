#!/usr/bin/env bash
# Runs libFuzzer targets for SECONDS each (default 300) and merges what they found into the
# committed corpus tests/fuzz_corpus/<target>/ (minimised with -merge=1; regress-* files, the
# inputs of fixed bugs, are kept as they are). Findings (crash-, leak-, timeout-, oom-) stop the
# target and are left in the printed artifacts directory.
# The committed corpus is kept small: the seeds (seed-*), the regress-* files and the
# MAX_FILES (default 30) smallest files of the minimised set.
# Usage: [MAX_FILES=30] fuzz/run_fuzz.sh BUILD_DIR [SECONDS] [TARGET...]   (from the repository root)
set -uo pipefail
B=${1:?usage: fuzz/run_fuzz.sh BUILD_DIR [SECONDS] [TARGET...]}
S=${2:-300}
shift $(( $# >= 2 ? 2 : 1 ))
T=("$@")
[ ${#T[@]} -eq 0 ] && T=(safetensors gguf hf_config tokenizer_json chat_jsonl token_shard)
W=$(mktemp -d /tmp/dtr_fuzz.XXXXXX)
"$B/bin/dtr-fuzz-seeds" "$W/seeds" > /dev/null
for t in "${T[@]}"; do
  C=tests/fuzz_corpus/$t
  mkdir -p "$W/corpus/$t" "$W/min/$t" "$W/artifacts/$t" "$W/regress/$t" "$C"
  echo "== fuzz_$t for ${S}s (artifacts: $W/artifacts/$t)"
  "$B/bin/fuzz_$t" "$W/corpus/$t" "$C" "$W/seeds/$t" -max_total_time="$S" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$W/artifacts/$t/" -print_final_stats=1 > "$W/fuzz_$t.log" 2>&1
  rc=$?
  grep -E "^(stat::number_of_executed_units|stat::new_units_added)|ERROR|SUMMARY" "$W/fuzz_$t.log" | head -n 8
  [ $rc -ne 0 ] && echo "fuzz_$t: exit $rc, see $W/fuzz_$t.log and $W/artifacts/$t" && ls "$W/artifacts/$t"
  mv "$C"/regress-* "$W/regress/$t/" 2> /dev/null
  "$B/bin/fuzz_$t" -merge=1 "$W/min/$t" "$C" "$W/corpus/$t" "$W/seeds/$t" > "$W/merge_$t.log" 2>&1
  rm -f "$C"/*
  (cd "$W/min/$t" && ls -Sr | head -n "${MAX_FILES:-30}" | xargs -r cp -t "$OLDPWD/$C")
  for f in "$W/seeds/$t"/*; do cp "$f" "$C/seed-$(basename "$f" | sed 's/^seed_//')"; done
  cp "$W/regress/$t"/* "$C"/ 2> /dev/null
  echo "fuzz_$t: corpus $(ls "$C" | wc -l) files, $(du -sk "$C" | cut -f1) KiB"
done
