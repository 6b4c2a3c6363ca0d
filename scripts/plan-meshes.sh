#!/bin/bash
# The dry-run memory / comm plan of a recipe for every dp x tp x pp split of N ranks:
#   scripts/plan-meshes.sh RECIPE N [N ...] [-- extra dtr-train args]
# e.g. scripts/plan-meshes.sh configs/plan/llama3_70b_full.yaml 64 256 512
# tp runs over 1, 2, 4, 8 (those dividing the heads; dtr-train refuses the rest), pp over the
# divisors of N up to 16 (one stage per rank, 1F1B unless the recipe says otherwise, 1-row
# micro-batches); dp = N / (tp x pp). One line per split: peak per rank, params, sharded grads +
# AdamW state, activations and the bytes sent per step and rank (all mesh dims). Needs build/bin/dtr-train; runs one process each.
set -u
recipe=$1; shift
ns=(); extra=()
while [ $# -gt 0 ]; do
  if [ "$1" = "--" ]; then shift; extra=("$@"); break; fi
  ns+=("$1"); shift
done
bin=${DTR_TRAIN:-build/bin/dtr-train}
printf "%6s %5s %3s %3s  %12s  %12s %12s %12s  %12s\n" ranks dp tp pp "peak/rank" "params" "grads+opt" "activations" "comm/step"
for n in "${ns[@]}"; do
  for tp in 1 2 4 8; do
    for pp in 1 2 4 8 16; do
      [ $((n % (tp * pp))) -eq 0 ] || continue
      dp=$((n / (tp * pp)))
      out=$("$bin" --config "$recipe" --set distributed.dp_size=$dp --set distributed.tp_size=$tp \
            --set distributed.pp_size=$pp --dry-run --world-size "$n" "${extra[@]}" 2>&1)
      if ! grep -q "^memory per rank" <<<"$out"; then
        printf "%6s %5s %3s %3s  %s\n" "$n" "$dp" "$tp" "$pp" "$(grep -m1 error <<<"$out" | cut -c1-110)"
        continue
      fi
      awk -v n="$n" -v dp="$dp" -v tp="$tp" -v pp="$pp" '
        function mib(v, u) { sub(/,$/, "", u); return u == "GiB" ? v * 1024 : v }
        function show(m) { return m >= 1024 ? sprintf("%.2f GiB", m / 1024) : sprintf("%.1f MiB", m) }
        /^memory per rank/ {
          for (i = 1; i <= NF; i++) {
            if ($i == "params") p = mib($(i+1), $(i+2));
            if ($i == "grads" && $(i-1) != "unsharded") g = mib($(i+1), $(i+2));
            if ($i == "optimizer") o = mib($(i+1), $(i+2)); if ($i == "activations") a = mib($(i+1), $(i+2));
          }
        }
        /peak \(train step\)/ { pk = mib($4, $5) }
        /^  [a-z_]+: all_gather/ {
          for (i = 1; i <= NF; i++) if ($i ~ /^(all_gather|reduce_scatter|all_reduce|send)$/) c += mib($(i+1), $(i+2))
        }
        END { printf "%6s %5s %3s %3s  %12s  %12s %12s %12s  %12s\n", n, dp, tp, pp, show(pk), show(p), show(g + o), show(a), show(c) }
      ' <<<"$out"
    done
  done
done
