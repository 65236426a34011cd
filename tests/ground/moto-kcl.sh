#!/usr/bin/env bash
# A SEPARATE moto server (the same pinned venv as tests/ground/moto.sh) on its own loopback port, used
# only as the DynamoDB of the Java KCL 3.x MultiLangDaemon (kcl-import-3x, `make bench-kcl`'s KCL 3.x
# column): KCL 3.x creates its lease table with a global secondary index (LeaseOwnerToLeaseKeyIndex)
# and two more tables (WorkerMetricStats, CoordinatorState), which dynalite refuses (docs/testing.md,
# "The Java KCL 3.x"). moto's conditional writes are not atomic under concurrent requests: the KCL 3.x
# figures measured on it carry that caveat; Leasehold's own lease tables stay on dynalite. The SQS/S3
# moto of moto.sh is never touched.
#
#   tests/ground/moto-kcl.sh start    # install if needed, start unless running, wait until it answers
#   tests/ground/moto-kcl.sh stop     # stop it by PID
#   tests/ground/moto-kcl.sh status   # print the endpoint, exit 1 if not running
#
# The endpoint is written to $LEASEHOLD_STATE/moto-kcl.env (LEASEHOLD_KCL_DYNAMODB_ENDPOINT).
source "$(dirname "$0")/common.sh"
STATE_FILE="$LEASEHOLD_STATE/moto-kcl.env"

running() {
  [ -f "$STATE_FILE" ] || return 1
  # shellcheck disable=SC1090
  source "$STATE_FILE"
  pid_alive "${MOTO_KCL_PID:-}" && port_open "${MOTO_KCL_PORT:-0}"
}

start() {
  if running; then log "moto for the KCL 3.x already running (:$MOTO_KCL_PORT)"; return 0; fi
  stop quiet
  local venv port pid i
  venv="$(dirname "$(dirname "$(pinned_venv moto)")")"
  port="$(free_port)"
  setsid "$venv/bin/moto_server" -H 127.0.0.1 -p "$port" >"$LEASEHOLD_STATE/moto-kcl.log" 2>&1 < /dev/null &
  pid=$!
  cat > "$STATE_FILE" <<STATE
MOTO_KCL_PID=$pid
MOTO_KCL_PORT=$port
LEASEHOLD_KCL_DYNAMODB_ENDPOINT=http://127.0.0.1:$port
STATE
  for i in $(seq 1 300); do
    if port_open "$port"; then log "moto for the KCL 3.x on http://127.0.0.1:$port (pid $pid)"; return 0; fi
    pid_alive "$pid" || die "moto (KCL 3.x) exited during start; see $LEASEHOLD_STATE/moto-kcl.log"
    sleep 0.1
  done
  die "moto (KCL 3.x) did not answer on port $port within 30 s; see $LEASEHOLD_STATE/moto-kcl.log"
}

stop() {
  [ -f "$STATE_FILE" ] || return 0
  # shellcheck disable=SC1090
  source "$STATE_FILE"
  if pid_alive "${MOTO_KCL_PID:-}"; then kill "$MOTO_KCL_PID" 2>/dev/null || true; fi
  rm -f "$STATE_FILE"
  [ "${1:-}" = quiet ] || log "moto (KCL 3.x) stopped"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) running && { cat "$STATE_FILE"; exit 0; } || { echo "moto (KCL 3.x) not running" >&2; exit 1; } ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
