#!/usr/bin/env bash
# End-to-end tests of dtr-train on the CI recipes (configs/ci/*.yaml), run from the repo root:
#   train_e2e.sh meshes|resume|epochs|padding|packing|cp|pp|errors|moe_ep|moe_lora DTR_TRAIN COMPARE_METRICS [MPIRUN]
# meshes: the same 20-step LoRA recipe on 1 rank, dp 2 (FSDP), tp 2, tp 3, HSDP 2x2, dp 2 x tp 2
#         and tp 2 / tp 3 (uneven sequence shards) with sequence parallelism, dp 2 with
#         defer_fsdp_grad_sync=false (a reduce-scatter per micro-batch)
#         gives the same loss sequence within LOSS_RTOL (f32; see below). dp 2 x tp 2 runs FSDP + TP
#         (the "not built yet" skips below are kept for older builds).
# resume: a run stopped after step 13 (--stop-after) and rerun resumes from step_10 and
#         reproduces the uninterrupted run's losses 11..20 bit for bit; a run whose rank 1 is
#         SIGKILLed ends within a bounded time, keeps its last complete checkpoint and resumes
#         likewise; a dp-2 checkpoint resumed on tp 2 and on dp 2 x tp 2 continues within LOSS_RTOL.
# epochs: 2 epochs of 6 steps (48 samples, global batch 8) run 12 steps whatever max_steps
#         beyond that says (whichever comes first, as NeMo Automodel), 9 when max_steps=9; dp 2
#         gives the single-process losses within LOSS_RTOL over both epochs; runs stopped in
#         epoch 2 (resume from step_8 = epoch 1 batch 2) and in epoch 1 (resume from step_4, the
#         resumed run crosses the boundary) reproduce the uninterrupted losses bit for bit.
# padding: chat SFT batches padded to their longest sample equal batches padded to seq_len
#         (1 rank and dp 2; configs/ci/chat.yaml on the perlfaq data, skipped when absent).
# pp:     pipeline parallelism (distributed.pp_size) gives the single-process losses and validation
#         losses within LOSS_RTOL: pp 2 with 1f1b, gpipe with pp_microbatch_size 1 (8 micro-batches),
#         pp 2 x dp 2, pp 2 x tp 2 on the CI recipe (LoRA), with 4 layers interleaved 1F1B and a
#         layer list (3 + 1); the pp 2 step-10 checkpoint resumed on
#         1 rank and the single-process one on pp 2 continue the single-process losses; the pp 2
#         adapter export has the single-process adapter's tensors.
# cp:     context parallelism (distributed.cp_size) gives the single-process losses and
#         validation losses within LOSS_RTOL: cp 2, cp 4, dp 2 x cp 2, cp 2 x tp 2 on the CI recipe,
#         and on the chat SFT recipe cp 2 (cp slices with no label token), packed rows with cp 2 and
#         dp 2 x cp 2 (skipped without the data).
# packing: chat SFT with dataset.packed_sequence_size (rows of several samples, per-document
#         positions, block-diagonal causal attention) on dp 2, dp 3 and dp 2 x tp 2 gives the
#         single-process losses within LOSS_RTOL (configs/ci/chat.yaml on the perlfaq data).
# errors: bad recipes under mpirun give exactly one "dtr-train: error:" line and exit != 0.
# moe_ep: the MoE CI recipe (configs/ci/moe.yaml, a random Qwen3-MoE) with expert parallelism
#         ep 2 (2 ranks), ep 3 (3 ranks) and ep 2 x ep_shard 2 (4 ranks) gives the single-process
#         loss sequence within LOSS_RTOL, and every step's metrics.jsonl dispatch_bytes equals
#         what dropless top-k routing implies (below); the 1-rank run reports none.
#         Dispatch bytes of one step, summed over the dp ranks (the ep all-to-all counters count
#         input bytes): per MoE layer and micro-batch every rank exchanges its E int64 counts
#         once; every token position sends k rows of hidden f32 to their experts' ranks
#         (dispatch) and receives k back (combine); the backward runs both all-to-alls again
#         with the splits swapped:  L_moe x (micro-batches x E x 8 + 4 x tokens x k x hidden x 4).
#         Which rank sends how many rows depends on the routing (checked per rank against the
#         single-process routing in parallel_test_expert_parallel); the sum over ranks does not.
# moe_lora: LoRA on attention and on the MoE experts (configs/ci/moe_lora.yaml: peft target
#         "*.mlp.experts", the tiny HF Qwen3-MoE) with ep 2 (2 ranks), ep 4 and ep 2 x ep_shard 2
#         (4 ranks) gives the single-process losses within LOSS_RTOL and its PEFT adapter
#         (target_parameters experts.gate_up_proj / down_proj) within ADAPTER_ATOL; the adapter
#         loads in PEFT and gives the logits of the merged export (tests/golden/
#         check_peft_moe_adapter.py, with /work/.venv-ref or $DTR_BENCH_VENV; skipped without).
set -uo pipefail
mode="$1"; TRAIN="$2"; CMP="$3"; MPIRUN="${4:-mpirun}"
# f32 tolerance on the loss over 20 AdamW steps: TP sums partial products in another order and
# FSDP reduce-scatters / averages gradients (other sum order), each ~1 ulp (6e-8 relative) per
# op; AdamW's division by sqrt(v) passes such differences on without damping. Measured max
# over 20 steps on every mesh: 2.4e-8 relative; 1e-6 leaves a 40x margin and still catches a
# wrong weighting (dp / accumulation errors move the loss by > 1e-3).
LOSS_RTOL=1e-6
ROOT_FLAG=""; [ "$(id -u)" -eq 0 ] && ROOT_FLAG="--allow-run-as-root"
run() {  # run NP CONFIG [args...]
  local np="$1"; shift
  "$MPIRUN" -np "$np" --oversubscribe $ROOT_FLAG --mca btl self,vader,tcp --bind-to none "$TRAIN" --config "$@"
}
fail() { echo "FAIL: $*"; exit 1; }
# mesh_specs_vs_single SINGLE_DIR NAME:NP:KEY=VALUE... : the CI recipe with each spec's
# distributed keys gives SINGLE_DIR's losses and validation losses within LOSS_RTOL.
mesh_specs_vs_single() {
  local single="$1"; shift
  for spec in "$@"; do
    IFS=: read -r name np sets <<<"$spec"
    args=(); for kv in $sets; do args+=(--set "distributed.$kv"); done
    rm -rf "$out/$name"
    log=$(run "$np" configs/ci/single.yaml "${args[@]}" --set checkpoint.checkpoint_dir=$out/$name 2>&1) ||
      { echo "$log" | tail -20; fail "$name run"; }
    echo "== $name ($np ranks: $sets) vs single"
    "$CMP" $single/metrics.jsonl $out/$name/metrics.jsonl --rtol $LOSS_RTOL || fail "$name losses"
    "$CMP" $single/metrics.jsonl $out/$name/metrics.jsonl --rtol $LOSS_RTOL --key val_loss > /dev/null ||
      fail "$name validation losses"
  done
}
out=out/ci
# ep_meshes CFG PREFIX CHECK NAME:NP:EP...: runs CFG with distributed.ep_size=EP on NP ranks into
# $out/PREFIX_NAME, compares its losses with $out/PREFIX_single's, then runs CHECK NAME DIR LOG.
ep_meshes() {
  local cfg="$1" prefix="$2" check="$3" spec name np ep d log
  shift 3
  for spec in "$@"; do
    IFS=: read -r name np ep <<<"$spec"
    d=$out/${prefix}_$name
    rm -rf "$d"
    log=$(run "$np" "$cfg" --set distributed.ep_size=$ep --set checkpoint.checkpoint_dir=$d 2>&1) ||
      { echo "$log" | tail -20; fail "$prefix $name run"; }
    echo "== $prefix $name ($np ranks, ep $ep) vs single"
    "$CMP" $out/${prefix}_single/metrics.jsonl $d/metrics.jsonl --rtol $LOSS_RTOL || fail "$prefix $name losses"
    "$check" "$name" "$d" "$log"
  done
}

case "$mode" in
meshes)
  rm -rf $out/single && run 1 configs/ci/single.yaml > /dev/null || fail "single run"
  for spec in dp:2 tp:2 tp3:3 hsdp:4 dp_tp:4; do
    name="${spec%%:*}"; np="${spec##*:}"
    rm -rf "$out/$name"
    log=$(run "$np" "configs/ci/$name.yaml" 2>&1)
    if [ $? -ne 0 ]; then
      if [ "$name" = dp_tp ] && grep -q "not built yet" <<<"$log"; then
        echo "SKIP dp_tp: $(grep -m1 'dtr-train: error' <<<"$log")"; continue
      fi
      echo "$log" | tail -20; fail "$name run"
    fi
    echo "== $name ($np ranks) vs single"
    "$CMP" "$out/single/metrics.jsonl" "$out/$name/metrics.jsonl" --rtol $LOSS_RTOL || fail "$name losses"
    "$CMP" "$out/single/metrics.jsonl" "$out/$name/metrics.jsonl" --rtol $LOSS_RTOL --key val_loss > /dev/null ||
      fail "$name validation losses"
  done
  rm -rf "$out/tp_sp"
  run 2 configs/ci/tp.yaml --set distributed.sequence_parallel=true --set checkpoint.checkpoint_dir=$out/tp_sp \
      > /dev/null || fail "tp 2 + sequence parallel run"
  echo "== tp 2 + sequence parallel vs single"
  "$CMP" "$out/single/metrics.jsonl" "$out/tp_sp/metrics.jsonl" --rtol $LOSS_RTOL || fail "tp_sp losses"
  # gradients reduce-scattered after every micro-batch (2 per step here) instead of the last only
  rm -rf "$out/dp_nodefer"
  run 2 configs/ci/dp.yaml --set distributed.defer_fsdp_grad_sync=false --set checkpoint.checkpoint_dir=$out/dp_nodefer \
      > /dev/null || fail "dp 2 + defer_fsdp_grad_sync=false run"
  echo "== dp 2, defer_fsdp_grad_sync=false vs single"
  "$CMP" "$out/single/metrics.jsonl" "$out/dp_nodefer/metrics.jsonl" --rtol $LOSS_RTOL || fail "dp_nodefer losses"
  # seq_len 32 over tp 3: uneven sequence shards (11, 11, 10)
  rm -rf "$out/tp3_sp"
  run 3 configs/ci/tp3.yaml --set distributed.sequence_parallel=true --set checkpoint.checkpoint_dir=$out/tp3_sp \
      > /dev/null || fail "tp 3 + sequence parallel run (uneven sequence shards)"
  echo "== tp 3 + sequence parallel (seq_len 32: shards 11, 11, 10) vs single"
  "$CMP" "$out/single/metrics.jsonl" "$out/tp3_sp/metrics.jsonl" --rtol $LOSS_RTOL || fail "tp3_sp losses"
  [ -f "$out/single/adapter/adapter_model.safetensors" ] || fail "no adapter written"
  [ -f "$out/dp/adapter/adapter_config.json" ] || fail "no adapter written by the dp run"
  ;;
resume)
  common=(--set step_scheduler.ckpt_every_steps=5 --set checkpoint.keep_last=3)
  d=$out/resume
  rm -rf $d && mkdir -p $d
  run 2 configs/ci/dp.yaml "${common[@]}" --set checkpoint.checkpoint_dir=$d/full > /dev/null || fail "full run"
  # 1. stop after step 13, rerun: resumes from step_10
  run 2 configs/ci/dp.yaml "${common[@]}" --set checkpoint.checkpoint_dir=$d/stop --stop-after 13 > /dev/null ||
    fail "stopped run"
  [ -f $d/stop/step_10/metadata.json ] || fail "step_10 missing"
  log=$(run 2 configs/ci/dp.yaml "${common[@]}" --set checkpoint.checkpoint_dir=$d/stop 2>&1) || fail "resumed run"
  grep -q "resumed from $d/stop/step_10" <<<"$log" || { echo "$log"; fail "did not resume from step_10"; }
  echo "== stop after 13 + resume vs uninterrupted (exact)"
  "$CMP" $d/full/metrics.jsonl $d/stop/metrics.jsonl --from 1 --to 20 --rtol 0 || fail "resumed losses differ"
  # 2. SIGKILL rank 1 mid-run
  "$MPIRUN" -np 2 --oversubscribe $ROOT_FLAG --mca btl self,vader,tcp --bind-to none "$TRAIN" \
      --config configs/ci/dp.yaml "${common[@]}" --set checkpoint.checkpoint_dir=$d/kill \
      --set step_scheduler.max_steps=400 > $d/kill.log 2>&1 &
  mpipid=$!  # mpirun itself; the ranks are its children
  for _ in $(seq 600); do
    [ -d $d/kill/step_10 ] && break; sleep 0.1
  done
  [ -d $d/kill/step_10 ] || fail "no step_10 before kill"
  victim=$(pgrep -P $mpipid | tail -1)
  ps -o pid=,args= -p "$victim" | grep -q dtr-train || fail "child $victim of mpirun is not a rank"
  [ -n "$victim" ] || fail "no rank process found"
  start=$(date +%s)
  kill -9 "$victim"
  for _ in $(seq 120); do kill -0 $mpipid 2>/dev/null || break; sleep 0.5; done
  if kill -0 $mpipid 2>/dev/null; then kill -9 $mpipid; fail "job still running 60 s after SIGKILL"; fi
  echo "job ended $(( $(date +%s) - start )) s after SIGKILL of one rank"
  last=$(ls -d $d/kill/step_* | sed 's/.*step_//' | sort -n | tail -1)
  [ -f "$d/kill/step_$last/metadata.json" ] || fail "last checkpoint step_$last incomplete"
  echo "last complete checkpoint: step_$last"
  # rerun with the same 400-step schedule for comparability, stop at 20
  log=$(run 2 configs/ci/dp.yaml "${common[@]}" --set checkpoint.checkpoint_dir=$d/kill \
        --set step_scheduler.max_steps=400 --stop-after $((last + 5)) 2>&1) || { echo "$log"; fail "rerun after kill"; }
  grep -q "resumed from $d/kill/step_$last" <<<"$log" || { echo "$log"; fail "did not resume after kill"; }
  run 2 configs/ci/dp.yaml "${common[@]}" --set checkpoint.checkpoint_dir=$d/kill_ref \
      --set step_scheduler.max_steps=400 --stop-after $((last + 5)) > /dev/null || fail "reference run"
  echo "== killed + resumed vs uninterrupted (exact)"
  "$CMP" $d/kill_ref/metrics.jsonl $d/kill/metrics.jsonl --from 1 --to $((last + 5)) --rtol 0 || fail "losses after kill"
  # 3. dp 2 checkpoint resumed on tp 2
  mkdir -p $d/cross && cp -r $d/full/step_10 $d/cross/
  log=$(run 2 configs/ci/tp.yaml "${common[@]}" --set checkpoint.checkpoint_dir=$d/cross 2>&1) || { echo "$log"; fail "cross-mesh resume"; }
  grep -q "resumed from $d/cross/step_10" <<<"$log" || { echo "$log"; fail "did not resume on tp 2"; }
  echo "== dp 2 checkpoint resumed on tp 2 vs uninterrupted dp 2"
  "$CMP" $d/full/metrics.jsonl $d/cross/metrics.jsonl --from 11 --to 20 --rtol $LOSS_RTOL || fail "cross-mesh losses"
  # 4. the same dp 2 checkpoint resumed on dp 2 x tp 2 (4 ranks)
  mkdir -p $d/cross4 && cp -r $d/full/step_10 $d/cross4/
  log=$(run 4 configs/ci/dp_tp.yaml "${common[@]}" --set checkpoint.checkpoint_dir=$d/cross4 2>&1)
  if [ $? -ne 0 ] && grep -q "not built yet" <<<"$log"; then
    echo "SKIP dp 2 x tp 2 resume: $(grep -m1 'dtr-train: error' <<<"$log")"
  else
    grep -q "resumed from $d/cross4/step_10" <<<"$log" || { echo "$log"; fail "did not resume on dp 2 x tp 2"; }
    echo "== dp 2 checkpoint resumed on dp 2 x tp 2 vs uninterrupted dp 2"
    "$CMP" $d/full/metrics.jsonl $d/cross4/metrics.jsonl --from 11 --to 20 --rtol $LOSS_RTOL || fail "dp x tp losses"
  fi
  ;;
epochs)
  ep=(--set dataset.limit_samples=48 --set step_scheduler.num_epochs=2 --set step_scheduler.max_steps=100
      --set step_scheduler.ckpt_every_steps=4 --set checkpoint.keep_last=0 --progress lines)
  d=$out/epochs
  rm -rf $d && mkdir -p $d
  run 2 configs/ci/dp.yaml "${ep[@]}" --set checkpoint.checkpoint_dir=$d/full > $d/full.log 2>&1 ||
    { tail -5 $d/full.log; fail "2-epoch run"; }
  grep -q "done: 12 steps" $d/full.log || { tail -5 $d/full.log; fail "2 epochs of 6 steps did not run 12 steps"; }
  [ "$(grep -c '"epoch":0,' $d/full/metrics.jsonl)" -eq 6 ] && [ "$(grep -c '"epoch":1,' $d/full/metrics.jsonl)" -eq 6 ] ||
    fail "metrics do not show 6 steps in each epoch"
  echo "== 2 epochs (12 steps, max_steps 100 not reached)"
  run 1 configs/ci/single.yaml "${ep[@]}" --set checkpoint.checkpoint_dir=$d/single > /dev/null || fail "single 2-epoch run"
  echo "== 2 epochs: dp 2 vs single"
  "$CMP" $d/single/metrics.jsonl $d/full/metrics.jsonl --from 1 --to 12 --rtol $LOSS_RTOL || fail "dp 2 vs single over 2 epochs"
  log=$(run 2 configs/ci/dp.yaml "${ep[@]}" --set step_scheduler.max_steps=9 --set checkpoint.enabled=false \
        --set checkpoint.checkpoint_dir=$d/max9 2>&1) ||
    { echo "$log" | tail -5; fail "max_steps=9 run"; }
  grep -q "done: 9 steps" <<<"$log" || { echo "$log" | tail -5; fail "max_steps=9 with 2 epochs of 6 did not stop at 9"; }
  for spec in 10:8 5:4; do
    stop="${spec%%:*}"; from="${spec##*:}"
    run 2 configs/ci/dp.yaml "${ep[@]}" --set checkpoint.checkpoint_dir=$d/stop$stop --stop-after $stop > /dev/null ||
      fail "run stopped after $stop"
    log=$(run 2 configs/ci/dp.yaml "${ep[@]}" --set checkpoint.checkpoint_dir=$d/stop$stop 2>&1) ||
      { echo "$log" | tail -5; fail "run resumed after stop at $stop"; }
    grep -q "resumed from $d/stop$stop/step_$from" <<<"$log" || { echo "$log"; fail "did not resume from step_$from"; }
    echo "== stopped after step $stop, resumed from step_$from vs uninterrupted (exact)"
    "$CMP" $d/full/metrics.jsonl $d/stop$stop/metrics.jsonl --from 1 --to 12 --rtol 0 || fail "resumed losses differ"
  done
  ;;
padding)
  # SFT micro-batches padded to their longest sample (pad_seq_len_divisible 8, the default)
  # compute what batches padded to seq_len compute (right padding under a causal mask is never
  # attended, its labels are -100), on 1 rank and on dp 2; the dynamic run must run fewer
  # positions (tokens_per_s x step_time_s), or the comparison would be vacuous.
  for f in data/perlfaq-val.jsonl data/smollm2-135m-instruct.gguf; do
    [ -f "$f" ] || { echo "SKIP padding: $f is absent (scripts/fetch-data.sh, scripts/fetch-model.sh)"; echo PASS; exit 0; }
  done
  c=configs/ci/chat.yaml
  rm -rf $out/chat $out/chat_seq $out/chat_dp
  run 1 $c > /dev/null || fail "dynamic padding run"
  run 1 $c --set dataset.pad_seq_len_divisible=256 --set checkpoint.checkpoint_dir=$out/chat_seq > /dev/null ||
    fail "padded to seq_len run"
  run 2 $c --set checkpoint.checkpoint_dir=$out/chat_dp > /dev/null || fail "dp 2 dynamic padding run"
  echo "== padded to the longest sample (x8) vs padded to seq_len"
  "$CMP" $out/chat_seq/metrics.jsonl $out/chat/metrics.jsonl --rtol $LOSS_RTOL || fail "dynamic padding losses"
  echo "== dp 2 vs single, both padded to the longest sample"
  "$CMP" $out/chat/metrics.jsonl $out/chat_dp/metrics.jsonl --rtol $LOSS_RTOL || fail "dp 2 losses"
  positions() { awk -F'"tokens_per_s":' '{ split($0, a, "\"step_time_s\":"); split(a[2], t, ","); split($2, v, /[,}]/);
                                          s += v[1] * t[1] } END { printf "%d", s + 0.5 }' "$1"; }
  dyn=$(positions $out/chat/metrics.jsonl); full=$(positions $out/chat_seq/metrics.jsonl)
  echo "positions run: $dyn padded to the longest, $full padded to seq_len"
  [ "$dyn" -lt "$full" ] || fail "dynamic padding ran $dyn positions, not fewer than $full"
  ;;
pp)
  rm -rf $out/pp_single && run 1 configs/ci/single.yaml --set checkpoint.checkpoint_dir=$out/pp_single > /dev/null ||
    fail "single run"
  mesh_specs_vs_single $out/pp_single "pp2:2:pp_size=2" \
    "pp2gpipe:2:pp_size=2 pipeline.pp_schedule=gpipe pipeline.pp_microbatch_size=1" \
    "pp2dp2:4:pp_size=2 dp_size=2" "pp2tp2:4:pp_size=2 tp_size=2"
  # 4 layers: interleaved 1F1B (2 stages per rank) and a recipe layer list (3 + 1).
  rm -rf $out/pp_single4 && run 1 configs/ci/single.yaml --set model.config.num_hidden_layers=4 \
    --set checkpoint.checkpoint_dir=$out/pp_single4 > /dev/null || fail "4-layer single run"
  for spec in "pp2i:pipeline.pp_schedule=interleaved1f1b" "pp2list:pipeline.layers_per_stage=[3,1]"; do
    IFS=: read -r name set <<<"$spec"
    rm -rf "$out/$name"
    log=$(run 2 configs/ci/single.yaml --set model.config.num_hidden_layers=4 --set distributed.pp_size=2 \
          --set "distributed.$set" --set checkpoint.checkpoint_dir=$out/$name 2>&1) || { echo "$log" | tail -20; fail "$name run"; }
    echo "== $name (4 layers, pp 2, $set) vs single"
    "$CMP" $out/pp_single4/metrics.jsonl $out/$name/metrics.jsonl --rtol $LOSS_RTOL || fail "$name losses"
  done
  # Checkpoints load on another pp size: pp 2's step 10 on 1 rank, the single run's step 10 on pp 2.
  for spec in "pp2_to_1:pp2:1:" "1_to_pp2:pp_single:2:--set distributed.pp_size=2"; do
    IFS=: read -r name src np extra <<<"$spec"
    rm -rf "$out/$name" && mkdir -p "$out/$name" && cp -r "$out/$src/step_10" "$out/$name/"
    log=$(run "$np" configs/ci/single.yaml $extra --set checkpoint.checkpoint_dir=$out/$name 2>&1) ||
      { echo "$log" | tail -20; fail "$name resume"; }
    grep -q "resumed from $out/$name/step_10" <<<"$log" || { echo "$log"; fail "$name did not resume"; }
    echo "== $name: resumed at step 10 vs single"
    "$CMP" $out/pp_single/metrics.jsonl $out/$name/metrics.jsonl --from 11 --to 20 --rtol $LOSS_RTOL ||
      fail "$name losses"
  done
  CMPST="$(dirname "$CMP")/compare_safetensors"
  if [ -x "$CMPST" ]; then
    "$CMPST" $out/pp_single/adapter/adapter_model.safetensors $out/pp2/adapter/adapter_model.safetensors --atol 1e-6 ||
      fail "pp 2 adapter export differs"
  fi
  ;;
cp)
  rm -rf $out/cp_single && run 1 configs/ci/single.yaml --set checkpoint.checkpoint_dir=$out/cp_single > /dev/null ||
    fail "single run"
  mesh_specs_vs_single $out/cp_single "cp2:2:cp_size=2" "cp4:4:cp_size=4" "dp2cp2:4:cp_size=2" \
    "cp2tp2:4:cp_size=2 tp_size=2"
  for f in data/perlfaq-val.jsonl data/smollm2-135m-instruct.gguf; do
    [ -f "$f" ] || { echo "SKIP cp chat: $f is absent"; echo PASS; exit 0; }
  done
  c=configs/ci/chat.yaml
  rm -rf $out/cp_chat1 $out/cp_chat2
  run 1 $c --set checkpoint.checkpoint_dir=$out/cp_chat1 > /dev/null || fail "chat single run"
  run 2 $c --set distributed.cp_size=2 --set checkpoint.checkpoint_dir=$out/cp_chat2 > /dev/null || fail "chat cp 2 run"
  echo "== chat SFT cp 2 vs single"
  "$CMP" $out/cp_chat1/metrics.jsonl $out/cp_chat2/metrics.jsonl --rtol $LOSS_RTOL || fail "chat cp 2 losses"
  # packed rows (256 tokens: per-document positions and mask) split over cp
  pc=(--set dataset.path=data/perlfaq-train.jsonl --set dataset.limit_samples=40 --set dataset.packed_sequence_size=256)
  rm -rf $out/cp_pack1 $out/cp_pack2 $out/cp_pack_dp2cp2
  run 1 $c "${pc[@]}" --set checkpoint.checkpoint_dir=$out/cp_pack1 > /dev/null || fail "packed single run"
  for spec in cp_pack2:2 cp_pack_dp2cp2:4; do
    IFS=: read -r name np <<<"$spec"
    run "$np" $c "${pc[@]}" --set distributed.cp_size=2 --set checkpoint.checkpoint_dir=$out/$name > /dev/null ||
      fail "$name run"
    echo "== packed, $name ($np ranks) vs single"
    "$CMP" $out/cp_pack1/metrics.jsonl $out/$name/metrics.jsonl --rtol $LOSS_RTOL || fail "$name losses"
  done
  ;;
packing)
  for f in data/perlfaq-train.jsonl data/smollm2-135m-instruct.gguf; do
    [ -f "$f" ] || { echo "SKIP packing: $f is absent (scripts/fetch-data.sh, scripts/fetch-model.sh)"; echo PASS; exit 0; }
  done
  c=configs/ci/chat.yaml
  # 60 samples packed into rows of 256 tokens; global batch 6 rows (accumulation 6 / 3 / 2 / 3)
  common=(--set dataset.path=data/perlfaq-train.jsonl --set dataset.limit_samples=60
          --set dataset.packed_sequence_size=256 --set step_scheduler.global_batch_size=6)
  rm -rf $out/pack1 && run 1 $c "${common[@]}" --set checkpoint.checkpoint_dir=$out/pack1 > /dev/null ||
    fail "packed single run"
  for spec in dp2:2:1 dp3:3:1 dp2tp2:4:2; do
    IFS=: read -r name np tp <<<"$spec"
    rm -rf "$out/pack_$name"
    run "$np" $c "${common[@]}" --set distributed.tp_size=$tp --set checkpoint.checkpoint_dir=$out/pack_$name \
        > /dev/null || fail "packed $name run"
    echo "== packed $name ($np ranks) vs single"
    "$CMP" $out/pack1/metrics.jsonl $out/pack_$name/metrics.jsonl --rtol $LOSS_RTOL || fail "packed $name losses"
  done
  ;;
errors)
  check() {  # check NP expected-substring --set ...
    local np="$1" want="$2"; shift 2
    local err rc
    err=$(run "$np" configs/ci/single.yaml --set checkpoint.enabled=false "$@" 2>&1 >/dev/null); rc=$?
    local n; n=$(grep -c "dtr-train: error:" <<<"$err")
    [ $rc -ne 0 ] || fail "exit code 0 for $*"
    [ "$n" -eq 1 ] || { echo "$err"; fail "$n error lines for $*"; }
    grep -q -- "$want" <<<"$err" || { echo "$err"; fail "message for $* lacks '$want'"; }
    echo "ok ($np ranks, $*): $(grep 'dtr-train: error:' <<<"$err")"
  }
  check 2 "unknown key optimizer.lrr" --set optimizer.lrr=1
  check 2 "expected an integer" --set step_scheduler.max_steps=many
  check 2 "optimizer.lr must be >= 0" --set optimizer.lr=-1
  check 3 "mesh\|world\|dp_size" --set distributed.dp_size=2 --set distributed.tp_size=2
  check 4 "tp_size=4 does not divide num_attention_heads=6" --set distributed.tp_size=4 --set distributed.dp_size=1
  check 2 "no such file or directory" --set model.path=data/missing.gguf
  check 2 "is not divisible by step_scheduler.local_batch_size=2 x dp_size=2" --set step_scheduler.global_batch_size=6
  ;;
moe_ep)
  cfg=configs/ci/moe.yaml
  # configs/ci/moe.yaml: 2 MoE layers, 6 experts, top-2, hidden 32, global batch 12 x seq 32 in
  # micro-batches of 1 row
  L=2; E=6; K=2; H=32; MB=12; TOKENS=$((12 * 32))
  expected=$((L * (MB * E * 8 + 4 * TOKENS * K * H * 4)))
  check_dispatch() {  # NAME DIR LOG
    local got steps
    got=$(grep -o '"dispatch_bytes":[0-9]*' "$2/metrics.jsonl" | cut -d: -f2 | sort -u | tr '\n' ' ')
    steps=$(grep -c '"dispatch_bytes"' "$2/metrics.jsonl")
    echo "dispatch_bytes per step: $got(expected $expected, $steps steps)"
    [ "$got" = "$expected " ] && [ "$steps" -eq 8 ] || fail "$1 dispatch_bytes $got != $expected"
    grep -q "dispatch $(awk -v b=$expected 'BEGIN { printf "%.2f", b / 1048576 }') MiB" <<<"$3" ||
      fail "$1: no dispatch figure in the progress line"
  }
  rm -rf $out/moe_single && run 1 $cfg > /dev/null || fail "single run"
  ! grep -q dispatch_bytes $out/moe_single/metrics.jsonl || fail "1-rank run reports dispatch_bytes"
  ep_meshes $cfg moe check_dispatch ep2:2:2 ep3:3:3 ep2x2:4:2
  ;;
moe_lora)
  cfg=configs/ci/moe_lora.yaml
  # 6 AdamW steps at lr 1e-2 move an adapter weight by up to 6e-2; the ep runs differ by <= 1.5e-5
  # (f32 sums in another order, passed on by AdamW's 1 / sqrt(v)); a wrong expert gradient moves
  # a weight by ~lr per step.
  ADAPTER_ATOL=1e-4
  check_adapter() {  # NAME DIR LOG
    "$(dirname "$CMP")/compare_safetensors" $out/moe_lora_single/adapter/adapter_model.safetensors \
      "$2/adapter/adapter_model.safetensors" --atol $ADAPTER_ATOL || fail "$1 adapter"
  }
  rm -rf $out/moe_lora_single
  run 1 $cfg --set checkpoint.save_consolidated=true > /dev/null || fail "single run"
  grep -q '"experts.gate_up_proj"' $out/moe_lora_single/adapter/adapter_config.json || fail "no target_parameters"
  venv="${DTR_BENCH_VENV:-/work/.venv-ref}"
  if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import peft" 2>/dev/null; then
    "$venv/bin/python" tests/golden/check_peft_moe_adapter.py tests/golden/qwen3_moe_debug \
      $out/moe_lora_single/adapter $out/moe_lora_single/consolidated 2>/dev/null || fail "PEFT load of the expert adapter"
  else
    echo "SKIP PEFT load: no venv with peft at $venv"
  fi
  ep_meshes $cfg moe_lora check_adapter ep2:2:2 ep4:4:4 ep2x2:4:2
  ;;
*) fail "unknown mode $mode" ;;
esac
echo PASS
