#!/usr/bin/env bash
# The plotting environment for `make plots`: a Python venv in the cache with matplotlib from PyPI
# (idempotent), then docs/plots/plot.py, which draws docs/plots/*.png from the committed data files in
# docs/plots/data/.
#   tests/ground/plots.sh install   # the venv only; prints its python
#   tests/ground/plots.sh run       # install if needed, then draw every plot
source "$(dirname "$0")/common.sh"

# matplotlib 3.10.7 and its dependencies, pinned: tests/ground/python/plots.txt.
install() { PY="$(pinned_venv plots)"; }

case "${1:-run}" in
  install) install; echo "$PY" ;;
  run)
    install
    cd "$(dirname "$0")/../.."
    MPLBACKEND=Agg "$PY" docs/plots/plot.py
    ;;
  *) die "usage: $0 install|run" ;;
esac
