#!/usr/bin/env bash
# cargo-deny for `make lint`: installed from crates.io into the cache when missing (pinned), then run
# offline on the workspace's licences, bans and sources (deny.toml).
#   tests/ground/deny.sh install   # cargo-deny only (idempotent), prints its path
#   tests/ground/deny.sh check     # install if needed, then check
source "$(dirname "$0")/common.sh"
DENY_VERSION=0.20.2
ROOT="$LEASEHOLD_CACHE/tools/cargo-deny-$DENY_VERSION"
DENY="$ROOT/bin/cargo-deny"

install() {
  [ -x "$DENY" ] && return 0
  log "installing cargo-deny $DENY_VERSION into $ROOT (a few minutes, once)"
  (cd / && cargo install --quiet --locked --root "$ROOT" cargo-deny --version "=$DENY_VERSION") >&2 \
    || die "cargo install cargo-deny failed"
}

case "${1:-check}" in
  install) install; echo "$DENY" ;;
  check)
    install
    cd "$(dirname "$0")/../.."
    # cargo-deny reads the metadata of every platform's dependencies (windows-sys and the like), which a
    # build on this machine never downloads: fetch them first (from crates.io; a no-op once cached).
    cargo fetch --locked >&2 || die "cargo fetch failed"
    "$DENY" --offline --locked check --hide-inclusion-graph licenses bans sources
    ;;
  *) die "usage: $0 install|check" ;;
esac
