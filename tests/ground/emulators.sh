#!/usr/bin/env bash
# Installs, starts and stops the emulators on loopback: Kinesis (kinesalite), DynamoDB (dynalite) and a
# second Kinesis, kinesis-mock (npm kinesis-local), which has what kinesalite lacks (UpdateShardCount,
# on-demand streams, StreamARN parameters).
#
#   tests/ground/emulators.sh install   # npm install pinned versions into the cache (idempotent)
#   tests/ground/emulators.sh start     # install if needed, start what is not running on free ports, wait
#                                       # until each answers (a running emulator is left as it is)
#   tests/ground/emulators.sh stop      # stop all three by PID
#   tests/ground/emulators.sh status    # print the endpoints, exit 1 if not running
#   tests/ground/emulators.sh env       # print `export ...` lines for the endpoints
#
# The endpoints are written to $LEASEHOLD_STATE/emulators.env, which the test support crate reads.
source "$(dirname "$0")/common.sh"

# Versions: tests/ground/npm/*/package.json (kinesalite 3.3.3, dynalite 4.0.0, kinesis-local 0.6.2), locked.
GROUND_NPM="$(cd "$(dirname "$0")" && pwd)/npm"
NPM_DIR="$LEASEHOLD_CACHE/npm-emulators"
KINESIS_MOCK_DIR="$LEASEHOLD_CACHE/npm-kinesis-mock"
STATE_FILE="$LEASEHOLD_STATE/emulators.env"
# Short CREATING phases keep tests fast; the clients still wait for ACTIVE.
CREATE_MS="${LEASEHOLD_EMULATOR_CREATE_MS:-50}"

need_node() {
  command -v node >/dev/null || die "node is not installed (Node 20 is needed: apt-get install nodejs npm)"
  command -v npm >/dev/null || die "npm is not installed (apt-get install npm)"
}

# Installs the packages of a committed lockfile (tests/ground/npm/<name>) into the cache with `npm ci`:
# every transitive version and its integrity hash fixed, so a fresh machine runs what the tests ran.
npm_ci() {
  local name="$1" dir="$2" lock="$GROUND_NPM/$1/package-lock.json" stamp
  need_node
  stamp="$dir/.installed-$(cat "$GROUND_NPM/$name/package.json" "$lock" | cksum | cut -d' ' -f1)"
  if [ -f "$stamp" ]; then return 0; fi
  log "installing $name (tests/ground/npm/$name, npm ci) into $dir"
  mkdir -p "$dir"
  cp "$GROUND_NPM/$name/package.json" "$lock" "$dir/"
  (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >&2) || die "npm ci of $name failed"
  touch "$stamp"
}

install() { npm_ci emulators "$NPM_DIR"; }

install_kinesis_mock() { npm_ci kinesis-mock "$KINESIS_MOCK_DIR"; }

load_state() {
  [ -f "$STATE_FILE" ] || return 1
  # shellcheck disable=SC1090
  source "$STATE_FILE"
}

running_pair() {
  load_state || return 1
  pid_alive "${KINESALITE_PID:-}" && pid_alive "${DYNALITE_PID:-}" &&
    port_open "$KINESALITE_PORT" && port_open "$DYNALITE_PORT"
}

running_kinesis_mock() {
  load_state || return 1
  pid_alive "${KINESIS_MOCK_PID:-}" && port_open "${KINESIS_MOCK_PORT:-0}"
}

running() { running_pair && running_kinesis_mock; }

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
  if running_pair; then
    log "kinesalite and dynalite already running (kinesis :$KINESALITE_PORT, dynamodb :$DYNALITE_PORT)"
  else
    stop quiet
    start_pair
  fi
  if running_kinesis_mock; then
    log "kinesis-mock already running (:$KINESIS_MOCK_PORT)"
  else
    start_kinesis_mock
  fi
}

start_pair() {
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

# kinesis-mock listens on 0.0.0.0 with no host setting: kinesis-mock-loopback.js, preloaded, makes every
# server of the process listen on 127.0.0.1 and exits the process if one does not. It serves plain HTTP
# (our endpoint) and TLS (unused, but it will not start without its certificate).
start_kinesis_mock() {
  install_kinesis_mock
  local port tls_port pkg="$KINESIS_MOCK_DIR/node_modules/kinesis-local" wrapper
  wrapper="$(cd "$(dirname "$0")" && pwd)/kinesis-mock-loopback.js"
  port="$(free_port)"; tls_port="$(free_port)"
  # Its state is in memory only; stream operations take CREATE_MS like kinesalite's.
  (cd "$LEASEHOLD_STATE" && exec env KINESIS_MOCK_CERT_PATH="$pkg/server.json" \
    KINESIS_MOCK_PLAIN_PORT="$port" KINESIS_MOCK_TLS_PORT="$tls_port" \
    AWS_ACCOUNT_ID=000000000000 AWS_REGION=us-east-1 SHARD_LIMIT=100000 ON_DEMAND_STREAM_COUNT_LIMIT=100000 \
    CREATE_STREAM_DURATION="${CREATE_MS}ms" DELETE_STREAM_DURATION="${CREATE_MS}ms" \
    MERGE_SHARDS_DURATION="${CREATE_MS}ms" SPLIT_SHARD_DURATION="${CREATE_MS}ms" \
    UPDATE_SHARD_COUNT_DURATION="${CREATE_MS}ms" UPDATE_STREAM_MODE_DURATION="${CREATE_MS}ms" \
    REGISTER_STREAM_CONSUMER_DURATION="${CREATE_MS}ms" DEREGISTER_STREAM_CONSUMER_DURATION="${CREATE_MS}ms" \
    START_STREAM_ENCRYPTION_DURATION="${CREATE_MS}ms" STOP_STREAM_ENCRYPTION_DURATION="${CREATE_MS}ms" \
    SHOULD_PERSIST_DATA=false LOAD_DATA_IF_EXISTS=false LOG_LEVEL=WARN \
    setsid node -r "$wrapper" "$pkg/main.js") \
    >"$LEASEHOLD_STATE/kinesis-mock.log" 2>&1 < /dev/null &
  local pid=$!
  touch "$STATE_FILE"
  sed -i -e '/^KINESIS_MOCK_/d' -e '/^LEASEHOLD_KINESIS_MOCK_ENDPOINT=/d' "$STATE_FILE"
  cat >> "$STATE_FILE" <<STATE
KINESIS_MOCK_PID=$pid
KINESIS_MOCK_PORT=$port
KINESIS_MOCK_TLS_PORT=$tls_port
LEASEHOLD_KINESIS_MOCK_ENDPOINT=http://127.0.0.1:$port
STATE
  wait_port kinesis-mock "$port" "$pid"
  log "kinesis-mock on http://127.0.0.1:$port (pid $pid)"
}

stop() {
  [ -f "$STATE_FILE" ] || return 0
  # shellcheck disable=SC1090
  source "$STATE_FILE"
  local pid
  for pid in "${KINESALITE_PID:-}" "${DYNALITE_PID:-}" "${KINESIS_MOCK_PID:-}"; do
    if pid_alive "$pid"; then kill "$pid" 2>/dev/null || true; fi
  done
  rm -f "$STATE_FILE"
  [ "${1:-}" = quiet ] || log "emulators stopped"
}

case "${1:-}" in
  install) install; install_kinesis_mock ;;
  start) start ;;
  stop) stop ;;
  status) running && { cat "$STATE_FILE"; exit 0; } || { echo "emulators not running" >&2; exit 1; } ;;
  env) running || die "emulators not running: run tests/ground/emulators.sh start"
       echo "export LEASEHOLD_KINESIS_ENDPOINT=http://127.0.0.1:$KINESALITE_PORT"
       echo "export LEASEHOLD_DYNAMODB_ENDPOINT=http://127.0.0.1:$DYNALITE_PORT"
       echo "export LEASEHOLD_KINESIS_MOCK_ENDPOINT=http://127.0.0.1:$KINESIS_MOCK_PORT" ;;
  *) echo "usage: $0 install|start|stop|status|env" >&2; exit 2 ;;
esac
