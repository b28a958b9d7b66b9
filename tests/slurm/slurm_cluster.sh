# Sourced by the Slurm tests: a real single-node Slurm (munged, slurmctld, slurmd on
# loopback) in a scratch directory $W, torn down (and $W removed) when the shell exits.
# Sets W and SLURM_CONF; the node has the machine's online CPUs and the partition "debug".
# Needs root (the daemons run as root) and Debian's slurm-wlm and munge.
if [ "$(id -u)" != 0 ]; then echo "needs root to run slurmd"; exit 77; fi
for tool in munged slurmctld slurmd sbatch srun scontrol; do
  command -v $tool >/dev/null || { echo "missing $tool: run scripts/setup.sh"; exit 1; }
done
W=$(mktemp -d /tmp/nsatron_slurm_XXXXXX)
PORT=$((20000 + ($$ % 2000) * 2))
cleanup() {
  for pidfile in "$W"/slurmd.pid "$W"/slurmctld.pid "$W"/munged.pid; do
    [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
  done
  sleep 1
  rm -rf "$W"
}
trap cleanup EXIT
cd "$W"
mkdir -p state spool

dd if=/dev/urandom of=munge.key bs=1024 count=1 2>/dev/null
chmod 600 munge.key
munged --force --socket="$W/munge.sock" --key-file="$W/munge.key" --log-file="$W/munge.log" \
  --pid-file="$W/munged.pid" --seed-file="$W/munge.seed"
cat > slurm.conf <<CONF
ClusterName=nsatrontest
SlurmctldHost=localhost
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$W/munge.sock
StateSaveLocation=$W/state
SlurmdSpoolDir=$W/spool
SlurmctldPidFile=$W/slurmctld.pid
SlurmdPidFile=$W/slurmd.pid
SlurmctldLogFile=$W/slurmctld.log
SlurmdLogFile=$W/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
JobRequeue=1
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
NodeName=localhost CPUs=$(getconf _NPROCESSORS_ONLN) RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
# PMIx's client directory in the scratch folder too: a stale /tmp/spmix_appdir_0_2.0 left by
# another (killed) cluster on the machine made job 2 fail to launch.
mkdir -p "$W/pmix"
echo "PMIxCliTmpDirBase=$W/pmix" > mpi.conf
export SLURM_CONF="$W/slurm.conf"
# Open MPI's shared-memory segments in the scratch folder too: their names come from the
# PMIx namespace (slurm.pmix.<job>.<step>), the same in every test cluster, so two clusters
# on one machine (two test runs side by side) attached to each other's segments and a rank
# crashed in MPI_Init (SIGSEGV in mca_pml_ob1_recv_frag_callback_fin).
mkdir -p "$W/shm"
export OMPI_MCA_btl_vader_backing_directory="$W/shm"
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF"
for i in $(seq 1 60); do
  sinfo -h -o %t 2>/dev/null | grep -q idle && break
  sleep 0.5
done
sinfo

# A small corpus prepared into $W/data, and the [model], [nsa] and [data] sections of a tiny
# NSA model that reads it (each test adds its own [train] and the rest): tiny_run_config FILE.
tiny_run_config() {
  for i in $(seq 1 1500); do echo "the cat sat on the mat. a dog ran in the park. we read at night."; done > "$W/corpus.txt"
  "$NSATRON" data prepare --input "$W/corpus.txt" --output "$W/data" --tokenizer bytes --val-fraction 0.1 >/dev/null
  cat > "$1" <<CONF
[model]
vocab_size = 256
d_model = 32
n_layers = 2
n_heads = 4
n_kv_heads = 2
head_dim = 8
ffn_hidden = 64
[nsa]
cmp_block = 8
cmp_stride = 4
sel_block = 8
sel_count = 3
window = 16
[data]
train = "$W/data/train_*.bin"
val = "$W/data/val_*.bin"
CONF
}
