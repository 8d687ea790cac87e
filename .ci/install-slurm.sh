#!/usr/bin/env bash
# CI: install Slurm (slurm-wlm: slurmctld, slurmd, the client commands), munge and libpmix-dev
# (for srun --mpi=pmix) with apt, non-interactively, if they are missing. No daemon is started
# here: tests/slurm/conftest.py starts a private one-node cluster for the test session.
set -euo pipefail
need=()
for cmd in slurmctld slurmd sbatch scontrol munged; do
  command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || need+=("$cmd")
done
# Slurm's mpi/pmix plugin (srun --mpi=pmix) dlopens the unversioned libpmix.so
{ ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null || true; } | grep -q "libpmix.so " || need+=(libpmix.so)
if [ "${#need[@]}" -eq 0 ]; then
  echo "install-slurm: Slurm and munge already installed ($(slurmctld -V 2>/dev/null || /usr/sbin/slurmctld -V))"
  exit 0
fi
echo "install-slurm: missing ${need[*]}; installing slurm-wlm, munge and libpmix-dev"
sudo=
[ "$(id -u)" = 0 ] || sudo="sudo -n"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends slurm-wlm munge libpmix-dev >/dev/null
echo "install-slurm: $(/usr/sbin/slurmctld -V)"
