#!/usr/bin/env bash
# CI: install Slurm (slurm-wlm: slurmctld, slurmd, the client commands) and munge with apt,
# non-interactively, if they are missing. The daemons are not started here (nor by the
# packages in a container): tests/slurm/conftest.py starts a private one-node cluster.
set -euo pipefail
need=()
for cmd in slurmctld slurmd sbatch scontrol munged; do
  command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || need+=("$cmd")
done
if [ "${#need[@]}" -eq 0 ]; then
  echo "install-slurm: Slurm and munge already installed ($(slurmctld -V 2>/dev/null || /usr/sbin/slurmctld -V))"
  exit 0
fi
echo "install-slurm: missing ${need[*]}; installing slurm-wlm and munge"
sudo=
[ "$(id -u)" = 0 ] || sudo="sudo -n"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
# policy-rc.d-free containers do not start the daemons; --no-install-recommends keeps it small
$sudo apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
echo "install-slurm: $(/usr/sbin/slurmctld -V)"
