# One moto server (PyPI `moto[server]`, the pinned venv of tests/ground/python/moto.txt) on a free
# loopback port: sourced by moto.sh and moto-kcl.sh, which start one each. The caller sets
#   MOTO_WHAT      what this server is for, in log lines ("moto", "moto for the KCL 3.x")
#   MOTO_NAME      its file name stem in $LEASEHOLD_STATE (moto, moto-kcl: .env, .log)
#   MOTO_ENDPOINT  the variable its endpoint is written as, which the tests read
# and then calls moto_main "$@".
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

STATE_FILE="$LEASEHOLD_STATE/$MOTO_NAME.env"

install() { VENV="$(dirname "$(dirname "$(pinned_venv moto)")")"; }

running() {
  [ -f "$STATE_FILE" ] || return 1
  # shellcheck disable=SC1090
  source "$STATE_FILE"
  pid_alive "${SERVER_PID:-}" && port_open "${SERVER_PORT:-0}"
}

start() {
  if running; then log "$MOTO_WHAT already running (:$SERVER_PORT)"; return 0; fi
  stop quiet
  install
  local port pid i
  port="$(free_port)"
  setsid "$VENV/bin/moto_server" -H 127.0.0.1 -p "$port" >"$LEASEHOLD_STATE/$MOTO_NAME.log" 2>&1 < /dev/null &
  pid=$!
  cat > "$STATE_FILE" <<STATE
SERVER_PID=$pid
SERVER_PORT=$port
$MOTO_ENDPOINT=http://127.0.0.1:$port
STATE
  for i in $(seq 1 300); do
    if port_open "$port"; then log "$MOTO_WHAT on http://127.0.0.1:$port (pid $pid)"; return 0; fi
    pid_alive "$pid" || die "$MOTO_WHAT exited during start; see $LEASEHOLD_STATE/$MOTO_NAME.log"
    sleep 0.1
  done
  die "$MOTO_WHAT did not answer on port $port within 30 s; see $LEASEHOLD_STATE/$MOTO_NAME.log"
}

stop() {
  [ -f "$STATE_FILE" ] || return 0
  # shellcheck disable=SC1090
  source "$STATE_FILE"
  if pid_alive "${SERVER_PID:-}"; then kill "$SERVER_PID" 2>/dev/null || true; fi
  rm -f "$STATE_FILE"
  [ "${1:-}" = quiet ] || log "$MOTO_WHAT stopped"
}

moto_main() {
  case "${1:-}" in
    install) install ;;
    start) start ;;
    stop) stop ;;
    status) running && { cat "$STATE_FILE"; exit 0; } || { echo "$MOTO_WHAT not running" >&2; exit 1; } ;;
    *) echo "usage: $0 install|start|stop|status" >&2; exit 2 ;;
  esac
}
