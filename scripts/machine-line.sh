#!/usr/bin/env bash
# Prints the line the GPT benchmark scripts start with: the CPU's model name, family and model
# numbers (one model name covers several generations, e.g. "AMD EPYC"), the cores and the load.
#   scripts/machine-line.sh
set -euo pipefail
field() { grep -m1 "^$1\s*:" /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'; }
echo "== $(field 'model name') (family $(field 'cpu family'), model $(field model)), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
