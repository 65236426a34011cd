#!/usr/bin/env bash
# Makes sure the machine has what `make test` needs: Rust (with rustfmt and clippy) and Node/npm.
# Idempotent; installs only what is missing, from the package registries.
source "$(dirname "$0")/common.sh"

if ! command -v cargo >/dev/null; then
  [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
fi
command -v cargo >/dev/null || die "cargo is not installed; install Rust (rustup) first"
if command -v rustup >/dev/null; then
  rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
  rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
fi
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  log "installing nodejs and npm from Debian's packages"
  apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null
fi
node_major="$(node -p 'process.versions.node.split(".")[0]')"
[ "$node_major" -ge 18 ] || die "node $node_major is too old for the emulators (need 18+)"
"$(dirname "$0")/emulators.sh" install
"$(dirname "$0")/kclpy.sh" >/dev/null
