#!/usr/bin/env bash
# Keeps enough disk free for a full `make test` (a cold build of every test binary, the images, the
# node's containerd, the emulators' data) on a machine whose cargo target dir grows with every run.
#   tests/ground/disk.sh guard   # prune build leftovers until LEASEHOLD_MIN_FREE_GB (default 25) is free
#   tests/ground/disk.sh free    # print the GB free where the caches live
# Pruning goes from cheap to dear: incremental-compilation state (never needed for a full build), then
# the debug build of the target dir (rebuilt by the run). It fails when even that leaves too little.
source "$(dirname "$0")/common.sh"
MIN_FREE_GB="${LEASEHOLD_MIN_FREE_GB:-25}"
TARGET="${CARGO_TARGET_DIR:-$LEASEHOLD_CACHE/target}"

free_gb() { df --output=avail -B1G "$LEASEHOLD_CACHE" | tail -1 | tr -d ' '; }

guard() {
  local free
  free="$(free_gb)"
  if [ "$free" -ge "$MIN_FREE_GB" ]; then
    log "disk: ${free} GB free (need $MIN_FREE_GB)"
    return 0
  fi
  log "disk: ${free} GB free, below $MIN_FREE_GB: removing incremental-compilation state under $TARGET"
  find "$TARGET" -maxdepth 3 -type d -name incremental -prune -exec rm -rf {} + 2>/dev/null || true
  free="$(free_gb)"
  if [ "$free" -lt "$MIN_FREE_GB" ] && [ -d "$TARGET/debug" ]; then
    log "disk: ${free} GB free, still below $MIN_FREE_GB: removing $TARGET/debug (a full rebuild follows)"
    rm -rf "$TARGET/debug"
    free="$(free_gb)"
  fi
  [ "$free" -ge "$MIN_FREE_GB" ] ||
    die "disk: only ${free} GB free where the caches live ($LEASEHOLD_CACHE), $MIN_FREE_GB needed for make test"
  log "disk: ${free} GB free after pruning"
}

case "${1:-}" in
  guard) guard ;;
  free) free_gb ;;
  *) echo "usage: $0 guard|free" >&2; exit 2 ;;
esac
