#!/usr/bin/env bash
# `nsatron sweep run --slurm` on a real single-node Slurm: a job array of 3 runs, one of them
# signalled mid-run (SIGUSR1, as Slurm's --signal=USR1@90 would), which checkpoints, requeues
# itself and resumes; every run must finish with the losses of the same runs made locally
# (`sweep run` without --slurm), step for step, and a second `--slurm` submits nothing.
# usage: slurm_sweep.sh NSATRON SOURCE_DIR     (needs root: the daemons run as root)
set -euo pipefail
NSATRON=$(readlink -f "$1")
SRC=$(readlink -f "$2")
. "$SRC/tests/slurm/slurm_cluster.sh"

tiny_run_config tiny.toml
cat >> tiny.toml <<CONF
[train]
seq_len = 64
micro_batch = 4
global_batch = 8
eval_every = 100
eval_batches = 2
[optim]
lr = 1e-2
min_lr = 1e-3
warmup_steps = 5
[log]
every = 500
CONF
# The same study twice, into two folders: locally, and on Slurm. 1500 steps of 512 tokens each.
for where in local slurm; do
  cat > sweep_$where.toml <<CONF
[sweep]
base = "tiny.toml"
out = "$W/runs/$where"
budget = { tokens = 768000 }
[set]
"checkpoint.every" = 50
[axes]
"model.d_model" = [16, 32, 48]
CONF
done
export OMP_NUM_THREADS=1
runs="d_model-16 d_model-32 d_model-48"

echo "== the study locally"
ref_start=$(date +%s)
"$NSATRON" sweep run sweep_local.toml || { cat runs/local/*/run.log; exit 1; }
ref_seconds=$(( $(date +%s) - ref_start ))
wait_seconds=$(( 3 * ref_seconds > 180 ? 3 * ref_seconds : 180 ))

echo "== the study as a Slurm job array"
"$NSATRON" sweep run sweep_slurm.toml --slurm | tee submit.log
grep -q "submitted job array" submit.log || { echo "FAIL: nothing submitted"; exit 1; }
jid=$(cat runs/slurm/slurm/array_1ranks.job)
# Signal the middle run (array task 1) once it is well under way.
m=runs/slurm/d_model-32/metrics.jsonl
for i in $(seq 1 $(( 4 * wait_seconds ))); do
  [ -f "$m" ] && [ "$(grep -c '"loss"' "$m")" -ge 200 ] && break
  sleep 0.25
done
[ "$(grep -c '"loss"' "$m")" -ge 200 ] || { echo "FAIL: task 1 never got going"; cat runs/slurm/*/run.log; exit 1; }
scancel -s USR1 "${jid}_1"
for i in $(seq 1 120); do
  scontrol show job "${jid}_1" | grep -q "Restarts=1" && break
  sleep 0.5
done
scontrol show job "${jid}_1" | grep -q "Restarts=1" || { cat runs/slurm/d_model-32/run.log; echo "FAIL: task 1 did not requeue"; exit 1; }
sleep 2  # a new instance may not carry the revoked credential's second (see slurm_requeue.sh)
scontrol update jobid="${jid}_1" StartTime=now
for i in $(seq 1 $(( 2 * wait_seconds ))); do
  [ -z "$(squeue -h -j "$jid" 2>/dev/null)" ] && break
  sleep 0.5
done
[ -z "$(squeue -h -j "$jid" 2>/dev/null)" ] || { squeue; echo "FAIL: the array did not finish"; exit 1; }
cat runs/slurm/d_model-32/run.log
grep -q "signal 10 received: stopping after step" runs/slurm/d_model-32/run.log || { echo "FAIL: no signal stop"; exit 1; }
grep -q "resumed from" runs/slurm/d_model-32/run.log || { echo "FAIL: the requeued task did not resume"; exit 1; }

echo "== every run done, with the local run's losses at every step"
# The last record of each step counts (a resumed run appends the steps after its checkpoint again).
step_losses() { grep -o '"step": [0-9]*, "loss": [-0-9.e+]*' "$1" | awk -F'[:,]' '{last[$2]=$0} END {for (s in last) print last[s]}' | sort -t: -k2 -n; }
for r in $runs; do
  [ -f runs/slurm/$r/done.json ] || { cat runs/slurm/$r/run.log; echo "FAIL: $r has no done.json"; exit 1; }
  step_losses runs/local/$r/metrics.jsonl >local.loss
  step_losses runs/slurm/$r/metrics.jsonl >slurm.loss
  [ "$(wc -l <local.loss)" -eq 1500 ] || { echo "FAIL: local $r has $(wc -l <local.loss) steps"; exit 1; }
  diff local.loss slurm.loss >/dev/null || { diff local.loss slurm.loss | head; echo "FAIL: $r losses differ"; exit 1; }
  echo "$r: 1500 steps, final $(tail -1 slurm.loss)"
done

echo "== submitted again: nothing left to run"
"$NSATRON" sweep run sweep_slurm.toml --slurm | tee again.log
grep -q "nothing to submit" again.log || { echo "FAIL: submitted again"; exit 1; }
"$NSATRON" sweep report runs/slurm --no-fit | tee report.log
grep -q "3 runs (3 done)" report.log || { echo "FAIL: report"; exit 1; }
echo "1 passed, 0 failed"
