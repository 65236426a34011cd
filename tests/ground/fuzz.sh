#!/usr/bin/env bash
# The parsers' fuzz targets (fuzz/, cargo-fuzz + libFuzzer on the nightly toolchain); docs/testing.md,
# "Fuzzing". Idempotent: installs cargo-fuzz (crates.io) when it is missing.
#   tests/ground/fuzz.sh install          # cargo-fuzz, when missing
#   tests/ground/fuzz.sh build            # the fuzz targets
#   tests/ground/fuzz.sh smoke [TARGET..] # each target over its corpus and regressions, then briefly on new
#                                         # inputs (FUZZ_SMOKE_SECONDS, default 20); fails on any crash
#   tests/ground/fuzz.sh run [TARGET..]   # each target for FUZZ_SECONDS (default 600), new inputs kept in
#                                         # the corpus; two at a time (FUZZ_JOBS)
#   tests/ground/fuzz.sh minimize [TARGET..] # the committed corpus cut to its seeds and the fewest inputs
#                                         # that reach the same edges
#   tests/ground/fuzz.sh list             # the targets
# FUZZ_TARGET_DIR (default $LEASEHOLD_CACHE/target-fuzz-nightly) keeps the nightly, instrumented build
# apart from the stable one. FUZZ_SANITIZER (default none: the parsers are safe Rust) may be `address`.
source "$(dirname "$0")/common.sh"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
FUZZ="$ROOT/fuzz"
CARGO_FUZZ_VERSION="${CARGO_FUZZ_VERSION:-0.13.2}"
TOOLCHAIN="${FUZZ_TOOLCHAIN:-nightly}"
SANITIZER="${FUZZ_SANITIZER:-none}"
export CARGO_TARGET_DIR="${FUZZ_TARGET_DIR:-$LEASEHOLD_CACHE/target-fuzz-nightly}"
# Every target's libFuzzer run: a crash, a leak, a timeout or an OOM fails it. RSS is bounded so a
# parser that expands its input without bound is a finding, not a machine out of memory.
RSS_LIMIT_MB="${FUZZ_RSS_LIMIT_MB:-1024}"
TIMEOUT="${FUZZ_TIMEOUT:-10}"

[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

# The longest input of each target, in bytes: a Kinesis record is at most 1 MiB (KPL); answers, lines,
# rows and specs stay well under a few hundred KiB.
max_len() {
  case "$1" in
    kpl_aggregate) echo 1048576 ;;
    *) echo 262144 ;;
  esac
}

targets() {
  (cd "$FUZZ/fuzz_targets" && ls ./*.rs | sed 's|^\./||; s|\.rs$||')
}

install() {
  command -v rustup >/dev/null || die "rustup is needed for the nightly toolchain"
  if ! rustup toolchain list | grep -q "^$TOOLCHAIN"; then
    log "installing the $TOOLCHAIN toolchain"
    rustup toolchain install "$TOOLCHAIN" --profile minimal >&2
  fi
  if ! cargo fuzz --version >/dev/null 2>&1; then
    log "installing cargo-fuzz $CARGO_FUZZ_VERSION from crates.io"
    cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked >&2
  fi
}

build() {
  install
  log "building the fuzz targets ($TOOLCHAIN, sanitizer $SANITIZER, target dir $CARGO_TARGET_DIR)"
  local started=$SECONDS
  (cd "$ROOT" && cargo "+$TOOLCHAIN" fuzz build -O -a -s "$SANITIZER" --fuzz-dir "$FUZZ") >&2
  log "fuzz targets built in $((SECONDS - started)) s"
}

# The binary of target $1 (cargo-fuzz builds for the host triple, release).
binary() {
  local triple
  triple="$(rustc "+$TOOLCHAIN" -vV | sed -n 's/^host: //p')"
  echo "$CARGO_TARGET_DIR/$triple/release/$1"
}

# Options of every run of target $1 (the dictionary when it has one).
options() {
  local t="$1"
  printf '%s\n' "-rss_limit_mb=$RSS_LIMIT_MB" "-malloc_limit_mb=$RSS_LIMIT_MB" "-max_len=$(max_len "$t")" \
    "-timeout=$TIMEOUT" "-print_final_stats=1"
  [ -f "$FUZZ/dicts/$t.dict" ] && printf '%s\n' "-dict=$FUZZ/dicts/$t.dict"
  return 0
}

# Replays target $1's corpus and regression inputs, then fuzzes it for $2 seconds without writing into
# the committed corpus; crash inputs land in $LEASEHOLD_STATE/fuzz/artifacts/$1/.
smoke_one() {
  local t="$1" seconds="$2" bin work
  bin="$(binary "$t")"
  [ -x "$bin" ] || die "no fuzz binary for $t at $bin (build first)"
  work="$LEASEHOLD_STATE/fuzz/smoke/$t"
  rm -rf "$work" && mkdir -p "$work/corpus" "$LEASEHOLD_STATE/fuzz/artifacts/$t"
  mapfile -t opts < <(options "$t")
  local inputs=()
  for dir in "$FUZZ/corpus/$t" "$FUZZ/regressions/$t"; do [ -d "$dir" ] && inputs+=("$dir"); done
  # Every committed input once, one process: a regression input that crashes again fails here.
  if [ "${#inputs[@]}" -gt 0 ]; then
    local files=()
    mapfile -t files < <(find "${inputs[@]}" -type f ! -name '.*' | sort)
    if [ "${#files[@]}" -gt 0 ]; then
      "$bin" "${opts[@]}" -runs=1 "${files[@]}" >"$work/replay.log" 2>&1 || {
        tail -n 40 "$work/replay.log" >&2
        die "$t: a committed input fails (log: $work/replay.log)"
      }
    fi
  fi
  # New inputs for a while, from the committed ones (read only: new finds go to $work/corpus).
  "$bin" "${opts[@]}" -max_total_time="$seconds" -artifact_prefix="$LEASEHOLD_STATE/fuzz/artifacts/$t/" \
    "$work/corpus" "${inputs[@]}" >"$work/fuzz.log" 2>&1 || {
    tail -n 40 "$work/fuzz.log" >&2
    die "$t: crash found (inputs in $LEASEHOLD_STATE/fuzz/artifacts/$t/, log: $work/fuzz.log)"
  }
  log "$t: $(summary "$work/fuzz.log")"
}

# "N runs, E exec/s, cov C, corpus K" from a libFuzzer log.
summary() {
  local log="$1" runs speed cov corpus
  runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)"
  speed="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n1)"
  cov="$(grep -o 'cov: [0-9]*' "$log" | tail -n1 | cut -d' ' -f2)"
  corpus="$(grep -o 'corp: [0-9]*/[0-9]*[a-zA-Z]*' "$log" | tail -n1 | cut -d' ' -f2)"
  echo "${runs:-?} runs, ${speed:-?} exec/s, cov ${cov:-?}, corpus ${corpus:-?}"
}

# Fuzzes target $1 for $2 seconds, new inputs merged into the committed corpus afterwards (minimized).
run_one() {
  local t="$1" seconds="$2" bin work
  bin="$(binary "$t")"
  work="$LEASEHOLD_STATE/fuzz/run/$t"
  rm -rf "$work" && mkdir -p "$work/corpus" "$FUZZ/corpus/$t" "$LEASEHOLD_STATE/fuzz/artifacts/$t"
  mapfile -t opts < <(options "$t")
  local status=0
  nice -n "${FUZZ_NICE:-10}" "$bin" "${opts[@]}" -max_total_time="$seconds" \
    -artifact_prefix="$LEASEHOLD_STATE/fuzz/artifacts/$t/" "$work/corpus" "$FUZZ/corpus/$t" \
    >"$work/fuzz.log" 2>&1 || status=$?
  log "$t: $(summary "$work/fuzz.log")$([ "$status" = 0 ] || echo ", FAILED (exit $status, log $work/fuzz.log)")"
  [ "${FUZZ_MERGE:-1}" = 1 ] && minimize_one "$t" "$work/corpus"
  return "$status"
}

# Rewrites target $1's committed corpus as its seeds plus the fewest inputs, of the corpus and of the
# directories $2.., that reach every edge they reach (edges only, not hit counts: the corpus stays small).
minimize_one() {
  local t="$1" bin work
  shift
  bin="$(binary "$t")"
  work="$LEASEHOLD_STATE/fuzz/minimize/$t"
  rm -rf "$work" && mkdir -p "$work/corpus"
  find "$FUZZ/corpus/$t" -maxdepth 1 -type f -name 'seed-*' -exec cp {} "$work/corpus/" \;
  mapfile -t opts < <(options "$t")
  if nice -n "${FUZZ_NICE:-10}" "$bin" "${opts[@]}" -set_cover_merge=1 -use_counters=0 "$work/corpus" \
    "$FUZZ/corpus/$t" "$@" >"$work/merge.log" 2>&1; then
    rm -rf "${FUZZ:?}/corpus/$t" && mv "$work/corpus" "$FUZZ/corpus/$t"
  else
    log "$t: merge failed (log $work/merge.log); corpus left as it was"
  fi
  log "$t: corpus $(find "$FUZZ/corpus/$t" -type f | wc -l) inputs, $(du -sb "$FUZZ/corpus/$t" | cut -f1) bytes"
}

# Runs "$1_one <target> <seconds>" for every target in $3.., $FUZZ_JOBS at a time; fails if one failed.
each() {
  local fn="$1" seconds="$2" jobs="${FUZZ_JOBS:-2}" failed=0
  shift 2
  local pids=()
  for t in "$@"; do
    "$fn" "$t" "$seconds" &
    pids+=($!)
    if [ "${#pids[@]}" -ge "$jobs" ]; then
      wait "${pids[0]}" || failed=1
      pids=("${pids[@]:1}")
    fi
  done
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  [ "$failed" = 0 ]
}

cmd="${1:-smoke}"
shift || true
mapfile -t chosen < <(if [ "$#" -gt 0 ]; then printf '%s\n' "$@"; else targets; fi)
case "$cmd" in
  install) install ;;
  build) build ;;
  list) targets ;;
  smoke)
    build
    started=$SECONDS
    each smoke_one "${FUZZ_SMOKE_SECONDS:-20}" "${chosen[@]}" || die "fuzz smoke failed"
    log "fuzz smoke of ${#chosen[@]} targets passed in $((SECONDS - started)) s"
    ;;
  minimize)
    for t in "${chosen[@]}"; do minimize_one "$t"; done
    ;;
  run)
    build
    each run_one "${FUZZ_SECONDS:-600}" "${chosen[@]}" || die "a fuzz target failed (see the logs above)"
    ;;
  *) die "usage: $0 install|build|smoke|run|minimize|list [TARGET...]" ;;
esac
