#!/usr/bin/env bash
# Installs Debian's Slurm and munge packages when they are missing and we are root.
# Prints a clear message (and exits 0) otherwise: the Slurm tests then skip with that reason.
set -euo pipefail
need=()
for b in slurmctld slurmd munged scontrol sbatch; do
  command -v "$b" >/dev/null 2>&1 || need+=("$b")
done
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" != "0" ]; then
  echo "install-slurm: missing ${need[*]}; not root, so not installing (Slurm demo and tests will be skipped)" >&2
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-slurm: missing ${need[*]} and no apt-get here (Slurm demo and tests will be skipped)" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
# Debian's packages start the services; our dev cluster runs its own daemons.
for s in slurmctld slurmd munge; do systemctl stop "$s" >/dev/null 2>&1 || service "$s" stop >/dev/null 2>&1 || true; done
echo "install-slurm: installed slurmctld slurmd slurm-client munge"
