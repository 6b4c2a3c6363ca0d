# Sourced by bench/compare/head.sh, moe.sh and families.sh (after ROOT is set): the Python that
# runs the PyTorch side and the dtr-bench binary.
#   DTR_BENCH_VENV: a venv whose python imports torch (+ transformers / peft for the families);
#     default /work/.venv-ref when it exists (the fixture scripts' venv), else /tmp/dtr-bench-venv
#     (run.sh creates that one).
#   DTR_BUILD_DIR: the build with bin/dtr-bench (default $ROOT/build).
export DTR_BENCH_VENV=${DTR_BENCH_VENV:-$([ -x /work/.venv-ref/bin/python ] && echo /work/.venv-ref || echo /tmp/dtr-bench-venv)}
PY="$DTR_BENCH_VENV/bin/python"
BENCH=${DTR_BUILD_DIR:-$ROOT/build}/bin/dtr-bench
