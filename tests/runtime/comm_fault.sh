#!/usr/bin/env bash
# comm_fault.sh MPIEXEC BINARY MODE: runs BINARY on 3 ranks where rank 1 dies or hangs, and
# checks the job exits non-zero on its own (well before the outer 90 s guard) with the expected
# message. mode die: Open MPI reports the dead process; modes hang, max (a SIGSTOPped rank, the
# others in all_ranks_max) and split (communicator creation): dtr's timeout message.
set -u
mpiexec=$1 bin=$2 mode=$3
log=$(mktemp)
start=$(date +%s)
DTR_COMM_TIMEOUT_S=3 timeout 90 "$mpiexec" --oversubscribe --allow-run-as-root -np 3 --mca btl self,vader,tcp \
  --bind-to none "$bin" "$mode" >"$log" 2>&1
rc=$?
elapsed=$(( $(date +%s) - start ))
cat "$log"
echo "comm_fault.sh: mode $mode exit $rc after ${elapsed} s"
if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then echo "FAIL: job did not abort (rc $rc)"; exit 1; fi
if grep -q "not reached" "$log"; then echo "FAIL: a rank passed the collective"; exit 1; fi
want=""
case "$mode" in
  hang) want="collective all_reduce.* on group world.* timed out after 3 s" ;;
  max) want="collective all_ranks_max (MPI_Allreduce) on group world timed out after 3 s" ;;
  split) want="collective MPI_Comm_split on group .* timed out after 3 s" ;;
esac
if [ -n "$want" ] && ! grep -q "$want" "$log"; then echo "FAIL: no timeout message ($want)"; exit 1; fi
if [ -n "$want" ] && [ "$elapsed" -gt 30 ]; then echo "FAIL: ${elapsed} s to abort with a 3 s timeout"; exit 1; fi
echo PASS
