# shellcheck shell=bash
# ============================================================================================
# The common part of slurm/train.sbatch and slurm/multinode.sbatch, sourced by both (the
# sbatch file keeps the #SBATCH lines and the header; what happens on a stop, the settings and
# the MPI detection are described in slurm/train.sbatch).  Reads the job file (first argument
# or HPCPS_JOB), picks the launcher, places the servers, launches `hpcps train --resume auto`,
# forwards SIGUSR1/SIGTERM to the launcher and requeues by exit status.  Not a batch script.
# ============================================================================================
set -u
# (the MPI and Python environment are set up by the sbatch file before it sources this)

say() { echo "hpcps-slurm: $*"; }

JOB=${1:-${HPCPS_JOB:-}}
MAX_RESTARTS=${HPCPS_MAX_RESTARTS:-5}
WORKDIR=${HPCPS_WORKDIR:-${SLURM_SUBMIT_DIR:-$PWD}}
RESTART=${SLURM_RESTART_COUNT:-0}
NTASKS=${SLURM_NTASKS:-1}
NNODES=${SLURM_JOB_NUM_NODES:-1}
PY=$(command -v python3 || command -v python)

if [ -z "$JOB" ]; then
    say "error: no job file (usage: sbatch $0 JOB.toml, or HPCPS_JOB=JOB.toml)"; exit 2
fi
case "$JOB" in /*) ;; *) JOB="${SLURM_SUBMIT_DIR:-$PWD}/$JOB" ;; esac
cd "$WORKDIR" || { say "error: cannot cd to $WORKDIR"; exit 2; }

# from the job file: the number of servers and the run directory (this also checks the job
# file before any rank starts); from mpi4py: the MPI library it is linked with
JOB_INFO=$("$PY" -c 'import sys
from hpcps.config import ConfigError, load_job
try:
    cfg = load_job(sys.argv[1])
except ConfigError as e:
    sys.exit(f"hpcps-slurm: error: {e}")
try:
    import mpi4py
    mpi4py.rc.initialize = False
    from mpi4py import MPI
    lib = MPI.Get_library_version().replace(chr(0), "").strip().splitlines()[0]
except Exception as e:
    lib = f"unknown (mpi4py: {e})"
print(cfg.cluster.servers)
print(cfg.output.dir)
print(lib)' "$JOB") || exit 2
{ read -r SERVERS; read -r RUN_DIR; read -r MPI_LIB; } <<< "$JOB_INFO"

# ------------------------------------------------------------------ pick the launcher
PYBIN=$(dirname "$PY")
if [ -x "$PYBIN/mpirun" ]; then MPIRUN="$PYBIN/mpirun"; else MPIRUN=$(command -v mpirun || echo mpirun); fi
srun_has() { srun --mpi=list 2>&1 | grep -qw "$1"; }

LAUNCHER=${HPCPS_LAUNCHER:-auto}
if [ "$LAUNCHER" = auto ]; then
    case "$MPI_LIB" in
        *"Open MPI"*)
            if [ -x "$PYBIN/mpirun" ]; then LAUNCHER=mpirun        # the pip wheel
            elif srun_has pmix; then LAUNCHER=srun-pmix
            else LAUNCHER=mpirun; fi ;;
        *MPICH*|*"Intel(R) MPI"*|*MVAPICH*)
            if srun_has pmi2; then LAUNCHER=srun-pmi2; else LAUNCHER=mpirun; fi ;;
        *) LAUNCHER=mpirun ;;
    esac
fi

PLACEMENT=${HPCPS_PLACEMENT:-spread}
# spread: rank r on node r mod N (srun --distribution=cyclic, mpirun --map-by node), so the
# last K ranks -- the servers -- land on K different nodes when K <= N
SPREAD=0
[ "$PLACEMENT" = spread ] && [ "$NNODES" -gt 1 ] && SPREAD=1
TRAIN=("$PY" -m hpcps train "$JOB" --resume auto)
BLOCK_TERM=0
case "$LAUNCHER" in
    mpirun)
        # total CPUs of the allocation (homogeneous nodes), to decide on oversubscription
        CPUS=$(( ${SLURM_CPUS_ON_NODE:-1} * NNODES ))
        OMPI_MAJOR=$("$MPIRUN" --version 2>/dev/null | sed -n 's/.*Open MPI)\{0,1\} \([0-9]*\)\..*/\1/p' | head -1)
        LAUNCH=("$MPIRUN" -n "$NTASKS")
        if [ -n "$OMPI_MAJOR" ]; then
            LAUNCH+=(--bind-to none)
            MAP=slot
            [ "$SPREAD" = 1 ] && MAP=node
            if [ "$NTASKS" -gt "$CPUS" ]; then
                if [ "$OMPI_MAJOR" -ge 5 ]; then LAUNCH+=(--map-by "$MAP:OVERSUBSCRIBE")
                else LAUNCH+=(--map-by "$MAP" --oversubscribe); fi
            else
                LAUNCH+=(--map-by "$MAP")
            fi
            if [ "$(id -u)" = 0 ]; then
                export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
            fi
            BLOCK_TERM=1
        fi
        # shellcheck disable=SC2206
        LAUNCH+=(${HPCPS_MPIRUN_ARGS:-}) ;;
    srun*)
        LAUNCH=(srun -n "$NTASKS" --kill-on-bad-exit=1)
        case "$LAUNCHER" in
            srun-pmix) LAUNCH+=(--mpi=pmix) ;;
            srun-pmi2) LAUNCH+=(--mpi=pmi2) ;;
        esac
        [ "$SPREAD" = 1 ] && LAUNCH+=(--distribution=cyclic)
        # shellcheck disable=SC2206
        LAUNCH+=(${HPCPS_SRUN_ARGS:-}) ;;
    *)
        say "error: HPCPS_LAUNCHER=$LAUNCHER: use auto, mpirun, srun-pmix, srun-pmi2 or srun"; exit 2 ;;
esac
SHOWN="${LAUNCH[*]} ${TRAIN[*]}"
if [ "$BLOCK_TERM" = 1 ]; then
    SHOWN="$SHOWN  (mpirun started with SIGTERM blocked)"
    # start mpirun with SIGTERM blocked: the ranks (whose mask Open MPI resets) still get
    # Slurm's SIGTERM and checkpoint, but mpirun does not kill them first
    LAUNCH=("$PY" -c 'import os, signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
os.execvp(sys.argv[1], sys.argv[1:])' "${LAUNCH[@]}")
fi

# where the servers run (the last SERVERS ranks): rank r is on node r mod NNODES when spread
# (cyclic), on node r / (tasks per node) otherwise
SERVER_NODES=
for ((r = NTASKS - SERVERS; r < NTASKS; r++)); do
    if [ "$SPREAD" = 1 ]; then n=$((r % NNODES)); else n=$((r / ((NTASKS + NNODES - 1) / NNODES))); fi
    SERVER_NODES="$SERVER_NODES $n"
done
say "job ${SLURM_JOB_ID:-?} (${SLURM_JOB_NAME:-}) start $(date -Is), restart $RESTART of at most $MAX_RESTARTS, $NTASKS task(s) on $NNODES node(s) ${SLURM_JOB_NODELIST:-}"
say "job file $JOB; run directory $RUN_DIR"
say "MPI: $MPI_LIB"
say "launcher $LAUNCHER: $SHOWN"
say "$SERVERS server(s) (ranks $((NTASKS - SERVERS))..$((NTASKS - 1))) on node index(es):$SERVER_NODES; placement $PLACEMENT"
if [ "${HPCPS_DRY_RUN:-0}" = 1 ]; then
    say "HPCPS_DRY_RUN=1: not launching"; exit 0
fi
if [ "$RESTART" -gt 0 ]; then
    say "requeued run: resuming from the newest valid checkpoint in $RUN_DIR/ckpt (if any)"
fi

# ------------------------------------------------------------------ run, forwarding signals
GOT_TERM=0
INTERRUPTED=0
LAUNCHER_PID=
# shellcheck disable=SC2317  # (called from the traps)
forward() {   # $1: the signal that reached this script
    INTERRUPTED=1
    [ "$1" = TERM ] && GOT_TERM=1
    say "got SIG$1 at $(date -Is); asking the ranks to checkpoint and stop (SIGUSR1 to the launcher)"
    [ -n "$LAUNCHER_PID" ] && kill -USR1 "$LAUNCHER_PID" 2>/dev/null
}
trap 'forward USR1' USR1
trap 'forward TERM' TERM

if [ "$INTERRUPTED" = 1 ]; then
    RC=75           # stopped before the launch: nothing to checkpoint, the last one stands
    say "not launching: a stop signal came first"
else
    "${LAUNCH[@]}" "${TRAIN[@]}" &
    LAUNCHER_PID=$!
    while :; do
        INTERRUPTED=0
        wait "$LAUNCHER_PID"
        RC=$?
        [ "$INTERRUPTED" = 0 ] && break     # the launcher ended (not a signal interrupting wait)
    done
    say "launcher exited with status $RC at $(date -Is)"
fi

# ------------------------------------------------------------------ done, or requeue
requeue() {
    if [ "$RESTART" -ge "$MAX_RESTARTS" ]; then
        say "not requeueing: $RESTART restart(s) already, HPCPS_MAX_RESTARTS=$MAX_RESTARTS"
        exit "$RC"
    fi
    say "$1: requeueing job $SLURM_JOB_ID (restart $((RESTART + 1)) of at most $MAX_RESTARTS)"
    if scontrol requeue "$SLURM_JOB_ID"; then
        exit 0
    fi
    say "error: scontrol requeue failed (submitted with --no-requeue, or JobRequeue=0?)"
    exit "$RC"
}

if [ "$GOT_TERM" = 1 ]; then
    say "Slurm is ending this job (scontrol requeue, preemption, time limit or scancel): it requeues it or not, this script does not"
    exit "$RC"
fi
case "$RC" in
    0)  say "finished; outputs in $RUN_DIR"; exit 0 ;;
    2)  say "job-file or launch error (status 2): not requeueing"; exit 2 ;;
    65) say "bad training data or non-finite values (status 65): not requeueing, a relaunch would fail the same way"; exit 65 ;;
    74) say "a checkpoint or output file could not be written (status 74, disk full or read-only?): not requeueing"; exit 74 ;;
    75) requeue "stopped by signal after a checkpoint" ;;
    *)  requeue "the launch failed (a rank died?)" ;;
esac
