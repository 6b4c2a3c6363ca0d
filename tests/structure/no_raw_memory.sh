#!/usr/bin/env bash
# no_raw_memory: code under parallel/ and dtensor/rules/ moves tensor data with tensor ops only
# (copy_, narrow, cat, chunk_cat, split_with_sizes_copy, casts ...), never through the bytes of
# a storage, so it runs unchanged on CPU and CUDA tensors (DESIGN.md section 10, issue 17).
# Fails when a source file there dereferences tensor storage directly:
#   data_ptr / data<T>() / mutable_data, storage()->data, from_blob, memcpy / memmove / memset,
#   std::copy / std::fill on pointers, reinterpret_cast, pointer casts static_cast<T*>.
# Allow-list (ALLOWED below, one "file:pattern" a line, with the reason): storage management
# that touches no element, e.g. FSDP's storage()->resize_ (PyTorch's untyped_storage().resize_)
# is not matched by the patterns at all. Comment lines (//) are skipped.
# Self-check: the patterns must flag a known bad snippet, so a broken regex cannot pass silently.
# Usage: no_raw_memory.sh [repo root]   (ctest: structure_no_raw_memory)
set -uo pipefail
ROOT=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
PATTERN='data_ptr|\.data<|->data<|mutable_data|storage\(\)(->|\.)data|from_blob|mem(cpy|move|set)\s*\(|std::(copy|fill|memcpy)\s*\(|reinterpret_cast|static_cast<[^<>]*\*\s*>'
# file (relative to ROOT) : fixed string of the allowed line, and why. Empty today.
ALLOWED=()

scan() {  # scan FILE...: prints file:line:text of every offending, non-comment, non-allowed line
  grep -nHE "$PATTERN" "$@" 2>/dev/null | while IFS= read -r hit; do
    file=${hit%%:*}
    rest=${hit#*:}
    text=${rest#*:}
    [[ "$text" =~ ^[[:space:]]*// ]] && continue
    rel=${file#"$ROOT"/}
    ok=0
    for a in "${ALLOWED[@]+"${ALLOWED[@]}"}"; do
      [[ "$rel" == "${a%%:*}" && "$text" == *"${a#*:}"* ]] && ok=1
    done
    [ $ok -eq 0 ] && echo "$rel:$rest"
  done
}

# Self-check on a snippet with one offence per pattern family (and a comment that must pass).
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/bad.cpp" <<'SNIP'
char* p = static_cast<char*>(t.data_ptr());
float* f = t.data<float>();
std::memcpy(dst, src, n);
std::copy(a.begin(), a.end(), b);
auto q = reinterpret_cast<const uint8_t*>(x);
// t.data_ptr() in a comment is fine
SNIP
found=$(scan "$tmp/bad.cpp" | wc -l)
if [ "$found" -ne 5 ]; then
  echo "no_raw_memory: self-check failed: the patterns flagged $found of 5 offending lines"
  exit 1
fi

mapfile -t files < <(find "$ROOT/parallel" "$ROOT/dtensor/rules" -name '*.cpp' -o -name '*.h' | sort)
if [ ${#files[@]} -eq 0 ]; then
  echo "no_raw_memory: no sources under $ROOT/parallel or $ROOT/dtensor/rules"
  exit 1
fi
bad=$(scan "${files[@]}")
if [ -n "$bad" ]; then
  echo "no_raw_memory: direct storage access under parallel/ or dtensor/rules/ (use tensor ops: copy_, narrow,"
  echo "cat, chunk_cat, split_with_sizes_copy; see tests/structure/no_raw_memory.sh):"
  echo "$bad"
  exit 1
fi
echo "no_raw_memory: ${#files[@]} files under parallel/ and dtensor/rules/ touch tensor data through tensor ops only"
