#!/usr/bin/env bash
# The plotting environment for `make plots`: a Python venv in the cache with matplotlib from PyPI
# (idempotent), then docs/plots/plot.py, which draws docs/plots/*.png from the committed data files in
# docs/plots/data/.
#   tests/ground/plots.sh install   # the venv only; prints its python
#   tests/ground/plots.sh run       # install if needed, then draw every plot
source "$(dirname "$0")/common.sh"

MATPLOTLIB_VERSION=3.10.7
VENV="$LEASEHOLD_CACHE/plots-venv"

install() {
  if [ -f "$VENV/.matplotlib-$MATPLOTLIB_VERSION" ] && [ -x "$VENV/bin/python" ]; then return 0; fi
  command -v python3 >/dev/null || die "python3 is not installed (apt-get install python3 python3-venv)"
  log "installing matplotlib $MATPLOTLIB_VERSION into $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV" || die "python3 -m venv failed (apt-get install python3-venv)"
  "$VENV/bin/pip" install -q "matplotlib==$MATPLOTLIB_VERSION" >&2 || die "pip install matplotlib failed"
  touch "$VENV/.matplotlib-$MATPLOTLIB_VERSION"
}

case "${1:-run}" in
  install) install; echo "$VENV/bin/python" ;;
  run)
    install
    cd "$(dirname "$0")/../.."
    MPLBACKEND=Agg "$VENV/bin/python" docs/plots/plot.py
    ;;
  *) die "usage: $0 install|run" ;;
esac
