#!/usr/bin/env bash
# Plots train and validation loss of a dtr-train metrics.jsonl into a PNG (gnuplot + jq).
#   scripts/plot-loss.sh out/smollm2_lora_perlfaq/metrics.jsonl [loss.png]
# dtr-train does the same at the end of a run (logging.plot_file).
set -euo pipefail
in="$1"; png="${2:-${in%.jsonl}.png}"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
jq -r 'select(.loss != null) | "\(.step) \(.loss)"' "$in" > "$tmp/train.dat"
jq -r 'select(.val_loss != null) | "\(.step) \(.val_loss)"' "$in" > "$tmp/val.dat"
plot="plot '$tmp/train.dat' using 1:2 with lines lw 2 title 'train'"
[ -s "$tmp/val.dat" ] && plot="$plot, '$tmp/val.dat' using 1:2 with linespoints lw 2 pt 7 title 'validation'"
gnuplot -e "set terminal pngcairo size 900,540 noenhanced; set output '$png'; set xlabel 'step'; set ylabel 'loss'; set grid; $plot"
echo "$png"
