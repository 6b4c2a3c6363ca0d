#!/usr/bin/env bash
# Builds dtr's real-data sets from Debian packages (no network access besides apt):
#   data/perlfaq-train.jsonl, data/perlfaq-val.jsonl  Q/A chat pairs from perl-doc's perlfaq1-9
#   data/bible.txt                                     the King James Bible (bible-kjv-text)
# Installs perl-doc and bible-kjv when missing (apt-get; sudo only when not root).
# Idempotent: outputs that exist are kept. Usage: scripts/fetch-data.sh [--force]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
force="${1:-}"
mkdir -p "$root/data"

need=()
ls /usr/share/perl/*/pod/perlfaq1.pod >/dev/null 2>&1 || need+=(perl-doc)
command -v bible >/dev/null 2>&1 || need+=(bible-kjv)
if [ ${#need[@]} -gt 0 ]; then
  echo "fetch-data: installing ${need[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "fetch-data: error: not root and no sudo; install as root: ${need[*]}" >&2; exit 1; }
    SUDO="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  # perl-doc is diverted by a stub in some images (perldoc asks to install it); a plain
  # install is enough here. Man pages / docs may be excluded by dpkg path filters: the pod
  # files live in /usr/share/perl, which is not filtered.
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

PY="${PYTHON:-python3}"
if [ "$force" = "--force" ] || [ ! -s "$root/data/perlfaq-train.jsonl" ] || [ ! -s "$root/data/perlfaq-val.jsonl" ]; then
  pods=$(ls /usr/share/perl/*/pod/perlfaq[1-9].pod | sort -u)
  "$PY" "$root/scripts/fetch-data-perlfaq.py" --train "$root/data/perlfaq-train.jsonl" \
    --val "$root/data/perlfaq-val.jsonl" $pods
else
  echo "fetch-data: perlfaq JSONL already present"
fi

if [ "$force" = "--force" ] || [ ! -s "$root/data/bible.txt" ]; then
  # bible-kjv's `bible` prints any range of verses; "Gen1:1-Rev22:21" is the whole book.
  # Each line is "Ge1:1 text"; the verse reference is dropped, one verse per line remains.
  bible -f Gen1:1-Rev22:21 2>/dev/null | sed -E 's/^[0-9]?[A-Za-z]+[0-9]+:[0-9]+ //' \
    > "$root/data/bible.txt.tmp" || true
  if [ ! -s "$root/data/bible.txt.tmp" ]; then
    echo "fetch-data: error: 'bible' printed nothing" >&2
    exit 1
  fi
  mv "$root/data/bible.txt.tmp" "$root/data/bible.txt"
  echo "fetch-data: wrote data/bible.txt ($(wc -c < "$root/data/bible.txt") bytes)"
else
  echo "fetch-data: data/bible.txt already present"
fi
