#!/usr/bin/env bash
# The 1 GiB 8→4 checkpoint conversion three ways, in one run, interleaved:
#   - tessera.parallel.convert_checkpoints (the Python package, in-process Rust),
#   - mindspore.parallel.convert_checkpoints (MindSpore 2.10 from PyPI),
#   - the `tessera ckpt convert` command line,
# and the two Tessera ones also without fsync (`fsync=False`, `--no-fsync`: MindSpore never
# fsyncs, so this is the like-for-like comparison).
# Input: `tessera bench ckpt-convert`'s 1 GiB source (8 × [8192, 4096] f32 over dev [2,4]
# map [1,0], safetensors) and its strategies (to dev [2,2] map [0,1]); see docs/PERFORMANCE.md.
#
#   scripts/bench-python.sh [REPS] [VARIANTS]
#     REPS default 5; VARIANTS, comma-separated, default all five:
#     python,python-nofsync,mindspore,cli,cli-nofsync
#
# Venvs (made when absent): target/bench-ms-venv (mindspore==2.10.0, safetensors==0.7.0 — the
# pin the reference cases need — and psutil) and target/bench-py-venv (this repository's
# python/ package, built by pip). Set TESSERA_MS_VENV / TESSERA_PY_VENV to reuse others.
# Everything it generates goes into one fresh temporary directory, removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
reps="${1:-5}"
only="${2:-python,python-nofsync,mindspore,cli,cli-nofsync}"

# A relative CARGO_TARGET_DIR would resolve against python/ when pip builds the package there.
if [ -n "${CARGO_TARGET_DIR:-}" ]; then export CARGO_TARGET_DIR="$(realpath -m "$CARGO_TARGET_DIR")"; fi
cargo build --release -p tessera-cli
tessera="$(realpath "${CARGO_TARGET_DIR:-target}")/release/tessera"

ms_venv="${TESSERA_MS_VENV:-target/bench-ms-venv}"
if ! "$ms_venv/bin/python" -c "import mindspore" 2>/dev/null; then
  python3 -m venv "$ms_venv"
  "$ms_venv/bin/pip" install --quiet --upgrade pip
  # If no MindSpore 2.10 wheel fits this Python, pip says so; use the closest version it offers.
  "$ms_venv/bin/pip" install --quiet "mindspore==2.10.0" "safetensors==0.7.0" psutil
fi
py_venv="${TESSERA_PY_VENV:-target/bench-py-venv}"
if [ ! -x "$py_venv/bin/python" ]; then
  python3 -m venv "$py_venv"
  "$py_venv/bin/pip" install --quiet --upgrade pip
fi
"$py_venv/bin/pip" install --quiet numpy psutil ./python

work="$(mktemp -d "${TMPDIR:-/tmp}/tessera-bench-python.XXXXXX")"
trap 'rm -rf "$work"' EXIT
echo "generating the 1 GiB source in $work/gen (not timed)…" >&2
"$tessera" bench ckpt-convert --dir "$work/gen" --keep --reps 1 >/dev/null

python3 scripts/bench_python.py --work "$work" --reps "$reps" --only "$only" --tessera "$tessera" \
  --ms-python "$ms_venv/bin/python" --py-python "$py_venv/bin/python"
