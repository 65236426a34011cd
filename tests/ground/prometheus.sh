#!/usr/bin/env bash
# Prometheus and promtool for the chart's alert tests and the live scrape check: unpacks Debian's
# `prometheus` package into the cache (no root needed, nothing installed system-wide) and prints the
# directory holding both binaries. Idempotent.
#   tests/ground/prometheus.sh install   # prints the bin directory
#   tests/ground/prometheus.sh path      # prints it if installed, fails otherwise
#   tests/ground/prometheus.sh crds      # the Prometheus Operator's CRDs (PodMonitor, ServiceMonitor,
#                                        # PrometheusRule) from its Go module; prints their directory
# The tests find the binaries at $LEASEHOLD_CACHE/prometheus/bin/{prometheus,promtool} and the CRDs in
# $LEASEHOLD_CACHE/prometheus/crds-<version>/.
source "$(dirname "$0")/common.sh"

DIR="$LEASEHOLD_CACHE/prometheus"
BIN_DIR="$DIR/bin"

# The Prometheus Operator release whose CRD schemas the chart's objects are checked against
# (operator/tests/monitoring_crds.rs); its Go module ships them under example/prometheus-operator-crd/.
OPERATOR_VERSION=v0.85.0
CRD_DIR="$DIR/crds-$OPERATOR_VERSION"
CRDS="podmonitors servicemonitors prometheusrules"

installed() { [ -x "$BIN_DIR/prometheus" ] && [ -x "$BIN_DIR/promtool" ]; }

case "${1:-install}" in
  install)
    if ! installed; then
      command -v apt-get >/dev/null || die "apt-get not found: put prometheus and promtool into $BIN_DIR by hand"
      rm -rf "$DIR/deb" "$DIR/root"
      mkdir -p "$DIR/deb" "$BIN_DIR"
      log "downloading Debian's prometheus package into $DIR"
      # apt-get download needs the package lists; a machine that never ran apt-get update has none.
      if ! (cd "$DIR/deb" && apt-get download prometheus >/dev/null 2>&1); then
        apt-get update >/dev/null 2>&1 || true
        (cd "$DIR/deb" && apt-get download prometheus >/dev/null) || die "apt-get download prometheus failed"
      fi
      dpkg-deb -x "$DIR"/deb/prometheus_*.deb "$DIR/root"
      for b in prometheus promtool; do
        [ -x "$DIR/root/usr/bin/$b" ] || die "$b not found in the prometheus package"
        cp -f "$DIR/root/usr/bin/$b" "$BIN_DIR/$b"
      done
      "$BIN_DIR/promtool" --version >/dev/null 2>&1 || die "$BIN_DIR/promtool does not run here (ldd it)"
      rm -rf "$DIR/deb" "$DIR/root"
    fi
    echo "$BIN_DIR"
    ;;
  path)
    installed || die "prometheus not installed: run tests/ground/prometheus.sh install"
    echo "$BIN_DIR"
    ;;
  crds)
    if [ ! -f "$CRD_DIR/.complete" ]; then
      command -v go >/dev/null || die "go is not installed (tests/ground/install-toolchain.sh)"
      if ! command -v jq >/dev/null; then
        log "installing jq from Debian's packages"
        (apt-get install -y -qq jq >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq jq >/dev/null)) \
          || die "jq is not installed and apt-get could not install it"
      fi
      log "fetching the Prometheus Operator $OPERATOR_VERSION CRDs from the Go module proxy"
      # Outside any module, `go mod download` fetches into the module cache and prints where.
      tmp="$(mktemp -d)"
      src="$(cd "$tmp" && go mod download -json "github.com/prometheus-operator/prometheus-operator@$OPERATOR_VERSION" | jq -r .Dir)"
      rm -rf "$tmp"
      [ -d "$src/example/prometheus-operator-crd" ] || die "go mod download of prometheus-operator@$OPERATOR_VERSION failed"
      mkdir -p "$CRD_DIR"
      for c in $CRDS; do cp -f "$src/example/prometheus-operator-crd/monitoring.coreos.com_$c.yaml" "$CRD_DIR/"; done
      chmod 644 "$CRD_DIR"/*.yaml
      touch "$CRD_DIR/.complete"
    fi
    echo "$CRD_DIR"
    ;;
  *) die "usage: $0 install|path|crds" ;;
esac
