#!/bin/bash
# Throughput of data, pipeline and tensor parallelism on GPUs: the 125M model
# (configs/nsa_125m.toml, bf16, 256 x 2048 tokens per step) on one GPU, then on every GPU of the
# machine with data parallelism (gradient buckets reduced after the backward, then overlapped with
# it: parallel.overlap_grad_reduce), with two pipeline stages (1F1B, then the interleaved
# schedule with 2 or 3 virtual stages; their messages on the copy engines, the default, then
# the balanced layouts again over NCCL), and with tp = 2 (dp over the rest), without and with
# parallel.tp_overlap, and with parallel.tp_micro_batch_pairs, at micro-batch 16 (the config's)
# and 32, their sums on the copy engines (parallel.tp_transport's default) and over NCCL.
# Prints the mean tokens/s,
# ms/step and MFU of steps 3..N of each run (the first steps warm up), and its speed-up over
# one GPU of the same micro-batch run earlier in the same call (`one`, or `one_m32` for the
# rows at micro-batch 32; absent where that row did not run). Each run takes one step more,
# N + 1, profiled (log.profile_step) and left out of the means: the row ends with each
# group's communication busy time on the GPU and the fraction of it hidden behind computation
# (rank 0's, launch/train/step.cpp's profile).
#
#   bash bench/parallel_gpu.sh BUILD_DIR DATA_DIR [STEPS [LAYOUT...]]
# DATA_DIR: prepared shards, e.g. runs/kjv/data; LAYOUTs: the names of the rows to run (one,
# dp2, pp2_dp1, ...; default all).
# Results: docs/performance.md, "GPU ranks: data, pipeline and tensor parallelism".
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:?usage: parallel_gpu.sh BUILD_DIR DATA_DIR [STEPS]}
DATA=${2:?usage: parallel_gpu.sh BUILD_DIR DATA_DIR [STEPS]}
STEPS=${3:-8}
NSATRON=$BUILD/launch/nsatron
GPUS=$(nvidia-smi -L | wc -l)
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
common=(--set "data.train=$DATA/train_*.bin" --set "data.val=[]" --set train.steps="$((STEPS + 1))"
        --set log.profile_step="$((STEPS + 1))" --set log.every=1000
        --set checkpoint.resume=never --overwrite)
ONLY=("${@:4}")  # layout names to run (default: all)
run() {  # name ranks settings...
  local name=$1 np=$2
  shift 2
  if [ ${#ONLY[@]} -gt 0 ] && [[ " ${ONLY[*]} " != *" $name "* ]]; then return 0; fi
  local args=(train configs/nsa_125m.toml "${common[@]}" --set checkpoint.dir="$OUT/$name" --set log.metrics="$OUT/$name.jsonl" "$@")
  if [ "$np" = 1 ]; then "$NSATRON" "${args[@]}" >"$OUT/$name.log" 2>&1
  else mpirun --allow-run-as-root --bind-to none -np "$np" "$NSATRON" "${args[@]}" >"$OUT/$name.log" 2>&1; fi \
    || { tail -20 "$OUT/$name.log"; return 1; }
  local base=one
  [[ "$name" == *m32* ]] && base=one_m32
  python3 bench/parallel_rows.py "$OUT/$name.jsonl" "$name" "$np" "$OUT/$base.tok" "$OUT/$name.log"
}
echo "$(nvidia-smi -L | head -1), $GPUS GPUs; 125M model, bf16, 256 x 2048 tokens per step, $STEPS steps"
run one 1
run dp$GPUS "$GPUS"
run dp${GPUS}_overlap "$GPUS" --set parallel.overlap_grad_reduce=true
run pp2_dp$((GPUS / 2)) "$GPUS" --set parallel.pp=2
run pp2_v2_dp$((GPUS / 2)) "$GPUS" --set parallel.pp=2 --set parallel.virtual_stages=2
# Balanced stages: the last stage also runs the 50k-row LM head and the cross entropy (about
# 2 layers' time at this size), so the first stage takes 7 of the 12 layers.
run pp2_7_5_dp$((GPUS / 2)) "$GPUS" --set parallel.pp=2 --set "parallel.pp_layers=[7, 5]"
# The same balance with the interleaved schedule: chunks of 4, 3, 3, 2 layers (stage 0: 7).
run pp2_v2_4332_dp$((GPUS / 2)) "$GPUS" --set parallel.pp=2 --set parallel.virtual_stages=2 \
  --set "parallel.pp_layers=[4, 3, 3, 2]"
# Other chunkings: stage 0's chunks [3, 4] layers and stage 1's [4, 1] + the LM head (the chunks
# as equal as whole layers allow with 2 virtual stages), and 3 virtual stages, [3, 2, 2, 2, 2, 1]
# (chunk times ~3, 2, 2, 2, 2 and 1 + the head's ~2 layers; a bubble of 1/49 at 16 micro-batches).
run pp2_v2_3441_dp$((GPUS / 2)) "$GPUS" --set parallel.pp=2 --set parallel.virtual_stages=2 \
  --set "parallel.pp_layers=[3, 4, 4, 1]"
run pp2_v3_322221_dp$((GPUS / 2)) "$GPUS" --set parallel.pp=2 --set parallel.virtual_stages=3 \
  --set "parallel.pp_layers=[3, 2, 2, 2, 2, 1]"
# The pipeline rows above send their messages with parallel.pp_transport's default ("auto": the
# copy engines on one host, posted ahead, each receive waited for where it is read); the same
# two balanced layouts with NCCL's send and receive kernels:
run pp2_7_5_nccl_dp$((GPUS / 2)) "$GPUS" --set parallel.pp=2 --set "parallel.pp_layers=[7, 5]" \
  --set parallel.pp_transport=nccl
run pp2_v2_4332_nccl_dp$((GPUS / 2)) "$GPUS" --set parallel.pp=2 --set parallel.virtual_stages=2 \
  --set "parallel.pp_layers=[4, 3, 3, 2]" --set parallel.pp_transport=nccl
run tp2_dp$((GPUS / 2)) "$GPUS" --set parallel.tp=2
# The ops around the NSA core in two halves of the micro-batch, one half's TP all-reduces beside
# the other's compute.
run tp2_overlap_dp$((GPUS / 2)) "$GPUS" --set parallel.tp=2 --set parallel.tp_overlap=true
# Two micro-batches in flight, their forwards and backwards layer by layer in turn: one's TP
# all-reduces beside the other's compute, at the full micro-batch (parallel.tp_micro_batch_pairs;
# the same bits as tp2), then with each layer's two NSA cores in one call (parallel.tp_pair_core).
run tp2_pairs_dp$((GPUS / 2)) "$GPUS" --set parallel.tp=2 --set parallel.tp_micro_batch_pairs=true
run tp2_pairs_joint_dp$((GPUS / 2)) "$GPUS" --set parallel.tp=2 --set parallel.tp_micro_batch_pairs=true \
  --set parallel.tp_pair_core=joint
# The tp rows above sum over parallel.tp_transport's default ("auto": the copy engines on one
# host, the adds on a stream of their own); without pairs and with them again over NCCL's
# all-reduce kernels:
run tp2_nccl_dp$((GPUS / 2)) "$GPUS" --set parallel.tp=2 --set parallel.tp_transport=nccl
run tp2_pairs_nccl_dp$((GPUS / 2)) "$GPUS" --set parallel.tp=2 --set parallel.tp_micro_batch_pairs=true \
  --set parallel.tp_transport=nccl
# A rank's kernels see half the heads: a micro-batch of 32 fills them better (against one GPU at
# 32: one_m32).
run one_m32 1 --set train.micro_batch=32
run tp2_m32_dp$((GPUS / 2)) "$GPUS" --set parallel.tp=2 --set train.micro_batch=32
run tp2_overlap_m32_dp$((GPUS / 2)) "$GPUS" --set parallel.tp=2 --set parallel.tp_overlap=true \
  --set train.micro_batch=32
run tp2_pairs_m32_dp$((GPUS / 2)) "$GPUS" --set parallel.tp=2 --set parallel.tp_micro_batch_pairs=true \
  --set train.micro_batch=32
run tp2_pairs_joint_m32_dp$((GPUS / 2)) "$GPUS" --set parallel.tp=2 --set parallel.tp_micro_batch_pairs=true \
  --set train.micro_batch=32 --set parallel.tp_pair_core=joint
run tp2_pairs_m32_nccl_dp$((GPUS / 2)) "$GPUS" --set parallel.tp=2 --set parallel.tp_micro_batch_pairs=true \
  --set train.micro_batch=32 --set parallel.tp_transport=nccl
