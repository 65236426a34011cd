#!/usr/bin/env bash
# Makes sure the machine has what `make test` needs: Rust (with rustfmt and clippy) and Node/npm.
# Idempotent; installs only what is missing, from the package registries.
source "$(dirname "$0")/common.sh"

if ! command -v cargo >/dev/null; then
  [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
fi
command -v cargo >/dev/null || die "cargo is not installed; install Rust (rustup) first"
# rust-toolchain.toml pins the toolchain. rustup would download a missing one, which these machines
# cannot; when the installed stable is that very release, it is linked under the pinned name instead.
pinned="$(sed -n 's/^channel = "\(.*\)"/\1/p' "$(dirname "$0")/../../rust-toolchain.toml")"
if command -v rustup >/dev/null && ! (cd / && rustup toolchain list) | grep -q "^$pinned-"; then
  stable_dir="$(cd / && rustc +stable --print sysroot 2>/dev/null || true)"
  if [ -n "$stable_dir" ] && (cd / && rustc +stable --version) | grep -q "^rustc $pinned "; then
    log "linking the installed stable ($pinned) as toolchain $pinned"
    ln -s "$stable_dir" "$(dirname "$stable_dir")/$pinned-$(basename "$stable_dir" | sed 's/^stable-//')"
  else
    (cd / && rustup toolchain install "$pinned" --profile minimal -c rustfmt -c clippy) \
      || die "toolchain $pinned (rust-toolchain.toml) is not installed and cannot be"
  fi
fi
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
