#!/usr/bin/env bash
# NeMo Automodel's own recipes run by dtr-train (tests/automodel/README.md says which files and
# commit; only model and data paths differ). Run from the repo root:
#   run_recipes.sh DTR_TRAIN COMPARE_METRICS [MPIRUN]
# For each recipe: 2 steps on 1 process (step_scheduler.max_steps / batch sizes / output dir
# given with --set, the file unchanged) end with "done: 2 steps", exactly one warning line
# naming the ignored Automodel keys, and the lr Automodel would use (optimizer.lr at step 1; with
# no lr_scheduler section the same lr at step 2). The same recipe on 2 ranks (dp_size: none ->
# dp 2) gives the single-process losses within LOSS_RTOL. Keys that would change results and are
# not built give one "dtr-train: error:" line naming them.
set -uo pipefail
TRAIN="$1"; CMP="$2"; MPIRUN="${3:-mpirun}"
LOSS_RTOL=1e-6  # as tests/apps/train_e2e.sh: f32 sums in another order over 2 steps
ROOT_FLAG=""; [ "$(id -u)" -eq 0 ] && ROOT_FLAG="--allow-run-as-root"
fail() { echo "FAIL: $*"; exit 1; }
out=out/automodel
rm -rf "$out"
small=(--set step_scheduler.max_steps=2 --set step_scheduler.global_batch_size=8 --set step_scheduler.local_batch_size=2
      )  # no --progress: auto must give plain lines under mpirun (its ranks get a pty)
lr_of() { grep "\"step\":$2," "$1" | sed 's/.*"lr":\([^,}]*\).*/\1/'; }
for recipe in llama3_2_1b_squad llama3_2_1b_squad_peft llama3_1_8b_columnmapped_lora; do
  f=tests/automodel/$recipe.yaml
  log=$("$TRAIN" --config "$f" "${small[@]}" --set checkpoint.checkpoint_dir=$out/$recipe 2>&1) ||
    { echo "$log" | tail -5; fail "$recipe: exit code $?"; }
  grep -q "done: 2 steps" <<<"$log" || { echo "$log" | tail -5; fail "$recipe: did not run 2 steps"; }
  n=$(grep -c "dtr-train: warning: NeMo Automodel keys" <<<"$log")
  [ "$n" -eq 1 ] || { echo "$log"; fail "$recipe: $n warning lines about ignored keys (expected 1)"; }
  m=$out/$recipe/metrics.jsonl
  lr1=$(lr_of $m 1); lr2=$(lr_of $m 2)
  want=$(grep -m1 "^  lr:" "$f" | awk '{print $2}')
  awk -v a="$lr1" -v b="$want" 'BEGIN { exit !(a == b + 0) }' || fail "$recipe: lr of step 1 is $lr1, expected optimizer.lr $want"
  if ! grep -q "^lr_scheduler:" "$f"; then
    awk -v a="$lr2" -v b="$want" 'BEGIN { exit !(a == b + 0) }' ||
      fail "$recipe: no lr_scheduler section but the lr of step 2 is $lr2 (Automodel: constant $want)"
  fi
  echo "ok $recipe (1 process): $(grep -m1 'dtr-train: warning' <<<"$log" | cut -c1-120)..."
  echo "   lr step 1 $lr1, step 2 $lr2; $(grep 'done:' <<<"$log")"
  "$MPIRUN" -np 2 --oversubscribe $ROOT_FLAG --mca btl self,vader,tcp --bind-to none "$TRAIN" --config "$f" "${small[@]}" \
      --set checkpoint.checkpoint_dir=$out/${recipe}_dp2 > $out/${recipe}_dp2.log 2>&1 ||
    { tail -5 $out/${recipe}_dp2.log; fail "$recipe: 2-rank run"; }
  grep -q "dp=2" $out/${recipe}_dp2.log || fail "$recipe: dp_size none did not derive dp 2 on 2 ranks"
  ! grep -q $'\r' $out/${recipe}_dp2.log || fail "$recipe: carriage returns in the log of an mpirun job"
  "$CMP" $m $out/${recipe}_dp2/metrics.jsonl --rtol $LOSS_RTOL || fail "$recipe: dp 2 losses differ from 1 process"
  echo "ok $recipe (2 ranks, dp_size none -> dp 2): losses equal the single process"
done
# The recipe as written (global batch 64, local 8: 2 steps of its 128 samples) on 2 ranks; its 8
# validation samples are fewer than local x dp = 16, so there is no validation loss to report
# (the done line said "validation loss -1.0000" before).
log=$("$MPIRUN" -np 2 --oversubscribe $ROOT_FLAG --mca btl self,vader,tcp --bind-to none "$TRAIN" \
      --config tests/automodel/llama3_2_1b_squad_peft.yaml --set checkpoint.checkpoint_dir=$out/as_written 2>&1) ||
  { echo "$log" | tail -5; fail "llama3_2_1b_squad_peft as written on 2 ranks"; }
grep -q "done: 2 steps" <<<"$log" || { echo "$log" | tail -5; fail "as written: did not run 2 steps"; }
! grep -q "validation loss -1" <<<"$log" || { echo "$log" | tail -3; fail "as written: reports validation loss -1"; }
echo "ok llama3_2_1b_squad_peft as written (2 ranks): $(grep 'done:' <<<"$log")"
reject() {  # reject RECIPE expected-substring --set ...
  local recipe="$1" want="$2"; shift 2
  local err rc n
  err=$("$TRAIN" --config "tests/automodel/$recipe.yaml" "${small[@]}" --set checkpoint.enabled=false "$@" 2>&1 >/dev/null); rc=$?
  n=$(grep -c "dtr-train: error:" <<<"$err")
  [ $rc -ne 0 ] && [ "$n" -eq 1 ] && grep -q -- "$want" <<<"$err" || { echo "$err"; fail "reject $recipe $*"; }
  echo "ok rejected ($*): $(grep 'dtr-train: error:' <<<"$err")"
}
reject llama3_2_1b_squad "with Adam (L2 in the gradient) is not built" --set optimizer.weight_decay=0.1
reject llama3_2_1b_squad "packed_sequence.split_across_pack=true" --set packed_sequence.packed_sequence_size=512 \
    --set packed_sequence.split_across_pack=true
reject llama3_2_1b_squad "dataset._target_=nemo_automodel.components.datasets.llm.hellaswag.HellaSwag" \
    --set dataset._target_=nemo_automodel.components.datasets.llm.hellaswag.HellaSwag
reject llama3_2_1b_squad "not a local file or directory" --set dataset.dataset_name=rajpurkar/squad
reject llama3_2_1b_squad_peft "peft.use_dora=true" --set peft.use_dora=true
echo PASS
