# Sourced by the benchmark scripts: sets $venv to a Python venv holding PyTorch (CPU), made under
# target/bench-venv (or $TESSERA_BENCH_VENV) when absent.
venv="${TESSERA_BENCH_VENV:-target/bench-venv}"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
  "$venv/bin/pip" install --quiet torch --index-url https://download.pytorch.org/whl/cpu \
    || "$venv/bin/pip" install --quiet torch
fi
