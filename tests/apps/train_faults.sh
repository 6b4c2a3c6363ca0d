#!/usr/bin/env bash
# Fault tests of dtr-train on the CI recipes, run from the repo root:
#   train_faults.sh MODE DTR_TRAIN TOOLS_DIR [MPIRUN]
# (TOOLS_DIR holds compare_metrics and compare_safetensors.)
# export:  checkpoint.save_consolidated with LoRA on 2 ranks (dp) and 4 ranks (dp 2 x tp 2):
#          the merged model and the adapter equal the 1-rank run's within EXPORT_ATOL (before:
#          heap corruption / MPI_ERR_TRUNCATE / segfault on > 1 rank).
# divergence: a loss that becomes NaN stops the run with one error line, keeps the last finite
#          checkpoint, writes no checkpoint / adapter after it and no null into metrics.jsonl
#          (before: exit 0, NaN checkpoints and adapter, keep_last removed the finite one);
#          on_nonfinite skip drops the updates and stops after 10 in a row; lr 0 on one batch
#          gives one collapse warning.
set -uo pipefail
mode="$1"; TRAIN="$2"; TOOLS="$3"; MPIRUN="${4:-mpirun}"
ROOT_FLAG=""; [ "$(id -u)" -eq 0 ] && ROOT_FLAG="--allow-run-as-root"
run() {  # run NP CONFIG [args...]
  local np="$1"; shift
  "$MPIRUN" -np "$np" --oversubscribe $ROOT_FLAG --mca btl self,vader,tcp --bind-to none "$TRAIN" --progress lines \
    --config "$@"
}
fail() { echo "FAIL: $*"; exit 1; }
out=out/ci_faults/$mode
rm -rf "$out" && mkdir -p "$out"

# Weights after 4 AdamW steps on another mesh: each step moves a weight by <= lr (5e-3) and the
# meshes' f32 sums differ by ~1 ulp per op (see train_e2e.sh); measured max 8e-8 over 20 steps.
EXPORT_ATOL=1e-6

case "$mode" in
export)
  steps=(--set step_scheduler.max_steps=4 --set checkpoint.save_consolidated=true)
  run 1 configs/ci/single.yaml "${steps[@]}" --set checkpoint.checkpoint_dir=$out/single > $out/single.log 2>&1 ||
    { tail -20 $out/single.log; fail "1-rank run"; }
  for spec in dp:2 dp_tp:4; do
    name="${spec%%:*}"; np="${spec##*:}"
    run "$np" configs/ci/$name.yaml "${steps[@]}" --set checkpoint.checkpoint_dir=$out/$name > $out/$name.log 2>&1 ||
      { tail -20 $out/$name.log; fail "$name run ($np ranks) with save_consolidated"; }
    echo "== $name ($np ranks): merged model and adapter vs 1 rank"
    "$TOOLS/compare_safetensors" $out/single/consolidated $out/$name/consolidated --atol $EXPORT_ATOL ||
      fail "$name merged model"
    "$TOOLS/compare_safetensors" $out/single/adapter/adapter_model.safetensors \
      $out/$name/adapter/adapter_model.safetensors --atol $EXPORT_ATOL || fail "$name adapter"
  done
  ;;
divergence)
  # lr 1e30 (after the 2 warm-up steps): the weights become ~1e30 and a later loss is NaN.
  diverge=(--set optimizer.lr=1e30 --set lr_scheduler.min_lr=0 --set step_scheduler.ckpt_every_steps=1
           --set checkpoint.keep_last=1)
  run 2 configs/ci/dp.yaml "${diverge[@]}" --set checkpoint.checkpoint_dir=$out/err > $out/err.log 2>&1
  rc=$?; cat $out/err.log | grep -E "error|warning" | head -5
  [ $rc -ne 0 ] || fail "diverged run exited 0"
  [ "$(grep -c 'dtr-train: error:' $out/err.log)" -eq 1 ] || fail "not exactly one error line"
  grep -q "dtr-train: error: step [0-9]*: loss is nan.*training diverged" $out/err.log || fail "no divergence message"
  bad=$(sed -n 's/.*dtr-train: error: step \([0-9]*\): loss is nan.*/\1/p' $out/err.log)
  last=$((bad - 1))  # keep_last 1 and a checkpoint every step: only step_<bad - 1> may be there
  [ -f $out/err/step_$last/metadata.json ] || fail "the last finite checkpoint step_$last was removed"
  [ -z "$(ls -d $out/err/step_* | grep -v "step_$last\$")" ] || fail "a checkpoint was written after the divergence"
  [ ! -e $out/err/adapter ] || fail "an adapter was exported from a diverged run"
  ! grep -q null $out/err/metrics.jsonl || fail "null in metrics.jsonl"
  echo "ok: stopped at the first non-finite step ($bad), step_$last kept, nothing exported"
  # on_nonfinite: skip: the updates are dropped (weights stay finite), then 10 in a row stop it.
  run 2 configs/ci/dp.yaml "${diverge[@]}" --set step_scheduler.on_nonfinite=skip \
      --set checkpoint.checkpoint_dir=$out/skip > $out/skip.log 2>&1
  rc=$?
  [ $rc -ne 0 ] || fail "skip run exited 0"
  grep -q "dtr-train: error: .*10 steps in a row were not finite" $out/skip.log || { cat $out/skip.log; fail "skip bound"; }
  grep -q "dtr-train: warning: step [0-9]* skipped" $out/skip.log || fail "no skip warning"
  grep -q '"skipped":true' $out/skip/metrics.jsonl || fail "skipped steps not recorded"
  ! grep -q null $out/skip/metrics.jsonl || fail "null in metrics.jsonl"
  echo "ok: on_nonfinite skip: $(grep -c '"skipped":true' $out/skip/metrics.jsonl) skipped steps, then stopped"
  # A run that does not learn (lr 0, the same batch every step): one collapse warning.
  run 1 configs/ci/single.yaml --set optimizer.lr=0 --set lr_scheduler.min_lr=0 --set dataset.limit_samples=8 \
      --set dataset.shuffle=false --set step_scheduler.max_steps=6 --set checkpoint.checkpoint_dir=$out/flat \
      > $out/flat.log 2>&1 || fail "flat run"
  grep -q "dtr-train: warning: step 5: the loss has stayed at .* for 5 steps" $out/flat.log || fail "no collapse warning"
  [ "$(grep -c 'looks collapsed' $out/flat.log)" -eq 1 ] || fail "collapse warned more than once"
  echo "ok: collapse warning"
  ;;
*) fail "unknown mode $mode" ;;
esac
echo PASS
