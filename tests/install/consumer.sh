#!/usr/bin/env bash
# consumer.sh BUILD_DIR SOURCE_DIR [CMAKE] [MPIRUN]
# 1. installs the libraries and the development files of BUILD_DIR into a temporary prefix
#    (cmake --install --component; the tools are not needed), then checks the layout;
# 2. builds examples/consumer with find_package(dtr) + dtr::dtr and runs it (1 process and
#    2 MPI ranks): it checks a value from every library (see its main.cpp);
# 3. builds the same main.cpp with `pkg-config --cflags --libs dtr` and runs it;
# 4. configures a parent project that add_subdirectory()s dtr (tests/install/subdir) and checks
#    that every library target exists.
set -euo pipefail
build="$1"; src="$2"; CMAKE="${3:-cmake}"; MPIRUN="${4:-mpirun}"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
prefix="$tmp/prefix"
for c in dtr_libraries dtr_development; do
  "$CMAKE" --install "$build" --prefix "$prefix" --component $c > "$tmp/install.log" || { cat "$tmp/install.log"; fail "install $c"; }
done
for f in include/dtr/tensor/tensor.h include/dtr/apps/train/recipe.h lib/cmake/dtr/dtrConfig.cmake \
         lib/cmake/dtr/dtrTargets.cmake lib/pkgconfig/dtr.pc lib/libdtr_tensor.so lib/libdtr_train.so; do
  [ -e "$prefix/$f" ] || fail "installed tree lacks $f"
done
echo "== installed into a temporary prefix: $(find "$prefix" -type f | wc -l) files"

gen=(); command -v ninja > /dev/null && gen=(-G Ninja)
"$CMAKE" -S "$src/examples/consumer" -B "$tmp/cmake" "${gen[@]}" \
    -DCMAKE_PREFIX_PATH="$prefix" > "$tmp/configure.log" 2>&1 || { cat "$tmp/configure.log"; fail "find_package(dtr)"; }
"$CMAKE" --build "$tmp/cmake" > "$tmp/build.log" 2>&1 || { tail -30 "$tmp/build.log"; fail "build against dtr::dtr"; }
out=$("$tmp/cmake/consumer") || fail "consumer (find_package) exited non-zero: $out"
[ "$out" = "dtr consumer ok" ] || fail "consumer (find_package) printed '$out'"
ROOT_FLAG=""; [ "$(id -u)" -eq 0 ] && ROOT_FLAG="--allow-run-as-root"
out=$("$MPIRUN" -np 2 --oversubscribe $ROOT_FLAG --mca btl self,vader,tcp --bind-to none "$tmp/cmake/consumer") ||
  fail "consumer under mpirun -np 2 exited non-zero: $out"
[ "$out" = "dtr consumer ok" ] || fail "consumer under mpirun -np 2 printed '$out'"
echo "== find_package(dtr) + dtr::dtr: built, ran on 1 process and 2 ranks"

export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
# shellcheck disable=SC2046
c++ $(pkg-config --cflags dtr) "$src/examples/consumer/main.cpp" -o "$tmp/consumer_pc" $(pkg-config --libs dtr) ||
  fail "build with pkg-config --cflags --libs dtr"
out=$(LD_LIBRARY_PATH="$prefix/lib" "$tmp/consumer_pc") || fail "consumer (pkg-config) exited non-zero: $out"
[ "$out" = "dtr consumer ok" ] || fail "consumer (pkg-config) printed '$out'"
echo "== pkg-config dtr: built and ran"

"$CMAKE" -S "$src/tests/install/subdir" -B "$tmp/subdir" "${gen[@]}" -DDTR_SOURCE_DIR="$src" -DDTR_CUDA=OFF \
    > "$tmp/subdir.log" 2>&1 || { tail -20 "$tmp/subdir.log"; fail "add_subdirectory(dtr)"; }
grep -q "every dtr library target defined" "$tmp/subdir.log" || fail "add_subdirectory check did not run"
echo "== add_subdirectory(dtr): every library target defined, no tests"
echo PASS
