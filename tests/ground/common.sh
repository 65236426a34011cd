#!/usr/bin/env bash
# Shared settings for the test-ground scripts: where caches and run state live.
# Everything is kept outside the clone so reruns (and CI on the same machine) reuse it.
set -euo pipefail

LEASEHOLD_CACHE="${LEASEHOLD_CACHE:-$HOME/.cache/leasehold}"
LEASEHOLD_STATE="${LEASEHOLD_STATE:-$LEASEHOLD_CACHE/run}"
mkdir -p "$LEASEHOLD_CACHE" "$LEASEHOLD_STATE"
export LEASEHOLD_CACHE LEASEHOLD_STATE

log() { printf '[ground] %s\n' "$*" >&2; }
die() { printf '[ground] error: %s\n' "$*" >&2; exit 1; }

# Prints a TCP port on 127.0.0.1 that was free a moment ago.
free_port() {
  node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'
}

# True when something accepts TCP connections on 127.0.0.1:$1.
port_open() {
  node -e 'const c=require("net").connect(+process.argv[1],"127.0.0.1");c.on("connect",()=>process.exit(0));c.on("error",()=>process.exit(1))' "$1"
}

# True when process $1 is alive.
pid_alive() { [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null; }

# The real node's network (tests/ground/node.sh), derived from $LEASEHOLD_STATE so that two test grounds
# on one machine get their own namespace, veth pair and /30: NODE_HOST_IP is the host end of the veth
# (the address the API server advertises, so the `kubernetes` Service leads there), NODE_IP the node's
# end inside the namespace NODE_NETNS. Neither is on the machine's external interface.
node_network() {
  local n
  n=$(( $(printf '%s' "$LEASEHOLD_STATE" | cksum | cut -d' ' -f1) % 63 ))
  NODE_INDEX=$n
  NODE_NETNS="leasehold-node-$n"
  NODE_HOST_IF="lhnode$n-h"
  NODE_IF="lhnode$n-n"
  NODE_HOST_IP="10.250.$((n * 4 / 256)).$(((n * 4) % 256 + 1))"
  NODE_IP="10.250.$((n * 4 / 256)).$(((n * 4) % 256 + 2))"
  NODE_NAME="leasehold-node"
  export NODE_INDEX NODE_NETNS NODE_HOST_IF NODE_IF NODE_HOST_IP NODE_IP NODE_NAME
}
node_network

# Prints the python of a venv in the cache made from a committed requirements file
# (tests/ground/python/<name>.txt): every package pinned, its dependencies too (a pip freeze of a working
# install), so a fresh machine installs what the tests ran. A changed file makes a new venv beside the
# old one, which a running server may still be using.
pinned_venv() {
  local name="$1" req venv
  req="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/python/$name.txt"
  [ -f "$req" ] || die "no requirements file $req"
  venv="$LEASEHOLD_CACHE/venv/$name-$(cksum < "$req" | cut -d' ' -f1)"
  if [ ! -f "$venv/.installed" ]; then
    command -v python3 >/dev/null || die "python3 is not installed (apt-get install python3 python3-venv)"
    log "installing tests/ground/python/$name.txt into $venv"
    rm -rf "$venv"
    python3 -m venv "$venv" >&2 || die "python3 -m venv failed (apt-get install python3-venv)"
    "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps -r "$req" >&2 \
      || die "pip install -r tests/ground/python/$name.txt failed"
    touch "$venv/.installed"
  fi
  echo "$venv/bin/python"
}
