#!/usr/bin/env bash
# libfaketime for the chaos suite's clock skew: unpacks Debian's libfaketime into the cache (no root
# needed) and prints the path of libfaketime.so.1. Idempotent.
#   tests/ground/faketime.sh install   # prints the library path
#   tests/ground/faketime.sh path      # prints it if installed, fails otherwise
source "$(dirname "$0")/common.sh"

DIR="$LEASEHOLD_CACHE/faketime"
find_lib() { find "$DIR" -name 'libfaketime.so.1' -path '*faketime*' 2>/dev/null | head -n1; }

case "${1:-install}" in
  install)
    lib="$(find_lib || true)"
    if [ -z "$lib" ]; then
      command -v apt-get >/dev/null || die "apt-get not found: install Debian's libfaketime by hand into $DIR"
      mkdir -p "$DIR/deb"
      log "downloading Debian's libfaketime into $DIR"
      (cd "$DIR/deb" && apt-get download libfaketime >/dev/null) || die "apt-get download libfaketime failed (run apt-get update?)"
      dpkg -x "$DIR"/deb/libfaketime_*.deb "$DIR/root"
      lib="$(find_lib)"
      [ -n "$lib" ] || die "libfaketime.so.1 not found in the package"
    fi
    echo "$lib"
    ;;
  path)
    lib="$(find_lib || true)"
    [ -n "$lib" ] || die "libfaketime not installed: run tests/ground/faketime.sh install"
    echo "$lib"
    ;;
  *) die "usage: $0 install|path" ;;
esac
