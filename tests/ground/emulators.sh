#!/usr/bin/env bash
# Installs, starts and stops the Kinesis (kinesalite) and DynamoDB (dynalite) emulators on loopback.
#
#   tests/ground/emulators.sh install   # npm install pinned versions into the cache (idempotent)
#   tests/ground/emulators.sh start     # install if needed, start both on free ports, wait until they answer
#   tests/ground/emulators.sh stop      # stop both by PID
#   tests/ground/emulators.sh status    # print the endpoints, exit 1 if not running
#   tests/ground/emulators.sh env       # print `export ...` lines for the endpoints
#
# The endpoints are written to $LEASEHOLD_STATE/emulators.env, which the test support crate reads.
source "$(dirname "$0")/common.sh"

KINESALITE_VERSION=3.3.3
DYNALITE_VERSION=4.0.0
NPM_DIR="$LEASEHOLD_CACHE/npm-emulators"
STATE_FILE="$LEASEHOLD_STATE/emulators.env"
# Short CREATING phases keep tests fast; the clients still wait for ACTIVE.
CREATE_MS="${LEASEHOLD_EMULATOR_CREATE_MS:-50}"

need_node() {
  command -v node >/dev/null || die "node is not installed (Node 20 is needed: apt-get install nodejs npm)"
  command -v npm >/dev/null || die "npm is not installed (apt-get install npm)"
}

install() {
  need_node
  local stamp="$NPM_DIR/.installed-$KINESALITE_VERSION-$DYNALITE_VERSION"
  if [ -f "$stamp" ]; then return 0; fi
  log "installing kinesalite@$KINESALITE_VERSION and dynalite@$DYNALITE_VERSION into $NPM_DIR"
  mkdir -p "$NPM_DIR"
  (cd "$NPM_DIR" && [ -f package.json ] || echo '{"name":"leasehold-emulators","private":true}' > "$NPM_DIR/package.json")
  npm install --prefix "$NPM_DIR" --no-audit --no-fund --loglevel=error \
    "kinesalite@$KINESALITE_VERSION" "dynalite@$DYNALITE_VERSION" >&2
  touch "$stamp"
}

running() {
  [ -f "$STATE_FILE" ] || return 1
  # shellcheck disable=SC1090
  source "$STATE_FILE"
  pid_alive "${KINESALITE_PID:-}" && pid_alive "${DYNALITE_PID:-}" &&
    port_open "$KINESALITE_PORT" && port_open "$DYNALITE_PORT"
}

wait_port() { # name port pid
  local i
  for i in $(seq 1 200); do
    if port_open "$2"; then return 0; fi
    pid_alive "$3" || die "$1 exited during start; see $LEASEHOLD_STATE/$1.log"
    sleep 0.1
  done
  die "$1 did not answer on port $2 within 20 s; see $LEASEHOLD_STATE/$1.log"
}

start() {
  if running; then log "emulators already running (kinesis :$KINESALITE_PORT, dynamodb :$DYNALITE_PORT)"; return 0; fi
  stop quiet
  install
  local kport dport
  kport="$(free_port)"; dport="$(free_port)"
  setsid node "$(dirname "$0")/kinesalite-loopback.js" "$NPM_DIR/node_modules/kinesalite" --port "$kport" \
    --shardLimit 100000 --createStreamMs "$CREATE_MS" --deleteStreamMs "$CREATE_MS" --updateStreamMs "$CREATE_MS" \
    >"$LEASEHOLD_STATE/kinesalite.log" 2>&1 < /dev/null &
  local kpid=$!
  setsid node "$NPM_DIR/node_modules/dynalite/cli.js" --host 127.0.0.1 --port "$dport" \
    --createTableMs "$CREATE_MS" --deleteTableMs "$CREATE_MS" --updateTableMs "$CREATE_MS" \
    >"$LEASEHOLD_STATE/dynalite.log" 2>&1 < /dev/null &
  local dpid=$!
  cat > "$STATE_FILE" <<STATE
KINESALITE_PID=$kpid
KINESALITE_PORT=$kport
DYNALITE_PID=$dpid
DYNALITE_PORT=$dport
LEASEHOLD_KINESIS_ENDPOINT=http://127.0.0.1:$kport
LEASEHOLD_DYNAMODB_ENDPOINT=http://127.0.0.1:$dport
STATE
  wait_port kinesalite "$kport" "$kpid"
  wait_port dynalite "$dport" "$dpid"
  log "kinesalite on http://127.0.0.1:$kport (pid $kpid), dynalite on http://127.0.0.1:$dport (pid $dpid)"
}

stop() {
  [ -f "$STATE_FILE" ] || return 0
  # shellcheck disable=SC1090
  source "$STATE_FILE"
  local pid
  for pid in "${KINESALITE_PID:-}" "${DYNALITE_PID:-}"; do
    if pid_alive "$pid"; then kill "$pid" 2>/dev/null || true; fi
  done
  rm -f "$STATE_FILE"
  [ "${1:-}" = quiet ] || log "emulators stopped"
}

case "${1:-}" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  status) running && { cat "$STATE_FILE"; exit 0; } || { echo "emulators not running" >&2; exit 1; } ;;
  env) running || die "emulators not running: run tests/ground/emulators.sh start"
       echo "export LEASEHOLD_KINESIS_ENDPOINT=http://127.0.0.1:$KINESALITE_PORT"
       echo "export LEASEHOLD_DYNAMODB_ENDPOINT=http://127.0.0.1:$DYNALITE_PORT" ;;
  *) echo "usage: $0 install|start|stop|status|env" >&2; exit 2 ;;
esac
