#!/usr/bin/env bash
# moto's server mode (PyPI `moto[server]`), standing in for SQS and S3: the on-failure destinations of
# retry.onExhausted deadLetter. Never for lease tables (its conditional writes are not atomic under
# concurrent requests; docs/testing.md). Installed into a venv in the cache, started on a free loopback
# port, shared like the emulators (a running server is left as it is).
#
#   tests/ground/moto.sh install   # the venv (idempotent)
#   tests/ground/moto.sh start     # install if needed, start unless running, wait until it answers
#   tests/ground/moto.sh stop      # stop it by PID
#   tests/ground/moto.sh status    # print the endpoint, exit 1 if not running
#
# The endpoint is written to $LEASEHOLD_STATE/moto.env (LEASEHOLD_MOTO_ENDPOINT), which the tests read.
source "$(dirname "$0")/common.sh"

# moto[server] 5.2.5 and its dependencies, pinned: tests/ground/python/moto.txt.
STATE_FILE="$LEASEHOLD_STATE/moto.env"

install() { VENV="$(dirname "$(dirname "$(pinned_venv moto)")")"; }

running() {
  [ -f "$STATE_FILE" ] || return 1
  # shellcheck disable=SC1090
  source "$STATE_FILE"
  pid_alive "${MOTO_PID:-}" && port_open "${MOTO_PORT:-0}"
}

start() {
  if running; then log "moto already running (:$MOTO_PORT)"; return 0; fi
  stop quiet
  install
  local port pid i
  port="$(free_port)"
  setsid "$VENV/bin/moto_server" -H 127.0.0.1 -p "$port" >"$LEASEHOLD_STATE/moto.log" 2>&1 < /dev/null &
  pid=$!
  cat > "$STATE_FILE" <<STATE
MOTO_PID=$pid
MOTO_PORT=$port
LEASEHOLD_MOTO_ENDPOINT=http://127.0.0.1:$port
STATE
  for i in $(seq 1 300); do
    if port_open "$port"; then log "moto on http://127.0.0.1:$port (pid $pid)"; return 0; fi
    pid_alive "$pid" || die "moto exited during start; see $LEASEHOLD_STATE/moto.log"
    sleep 0.1
  done
  die "moto did not answer on port $port within 30 s; see $LEASEHOLD_STATE/moto.log"
}

stop() {
  [ -f "$STATE_FILE" ] || return 0
  # shellcheck disable=SC1090
  source "$STATE_FILE"
  if pid_alive "${MOTO_PID:-}"; then kill "$MOTO_PID" 2>/dev/null || true; fi
  rm -f "$STATE_FILE"
  [ "${1:-}" = quiet ] || log "moto stopped"
}

case "${1:-}" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  status) running && { cat "$STATE_FILE"; exit 0; } || { echo "moto not running" >&2; exit 1; } ;;
  *) echo "usage: $0 install|start|stop|status" >&2; exit 2 ;;
esac
