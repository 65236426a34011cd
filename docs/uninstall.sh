#!/usr/bin/env bash
# The steps of docs/uninstall.md, in order: delete the StreamConsumers while the operator still runs
# (it applies each one's deletionPolicy and removes its `leasehold.io/lease-table` finalizer), clear
# the finalizer of any the operator could not finish (it is gone or failing), then uninstall the chart
# and delete the CRD. operator/tests/uninstall.rs runs this script on the local control plane.
#
#   docs/uninstall.sh (--all-namespaces | --namespace NS) [--release NAME --release-namespace NS]
#                     [--keep-crd] [--timeout SECONDS]
#
# --namespace NS      only the StreamConsumers of NS (--all-namespaces: every one in the cluster)
# --release NAME      the Helm release of the operator to uninstall (with --release-namespace)
# --keep-crd          leave the CRD (other namespaces still use it)
# --timeout SECONDS   how long the operator gets to finish the deletions (default 120)
# KUBECTL / HELM name the tools (default kubectl, helm); KUBECONFIG is honoured as usual.
set -euo pipefail
KUBECTL="${KUBECTL:-kubectl}"
HELM="${HELM:-helm}"
CRD=streamconsumers.leasehold.io
FINALIZER=leasehold.io/lease-table
die() { echo "uninstall.sh: $*" >&2; exit 1; }
say() { echo "uninstall.sh: $*" >&2; }

scope="" release="" release_ns="" keep_crd=0 timeout=120
while [ $# -gt 0 ]; do
  case "$1" in
    --all-namespaces) scope=(--all-namespaces); shift ;;
    --namespace) [ -n "${2:-}" ] || die "--namespace needs a value"; scope=(--namespace "$2"); shift 2 ;;
    --release) release="${2:-}"; shift 2 ;;
    --release-namespace) release_ns="${2:-}"; shift 2 ;;
    --keep-crd) keep_crd=1; shift ;;
    --timeout) timeout="${2:-}"; shift 2 ;;
    *) die "unknown argument $1" ;;
  esac
done
[ -n "${scope:-}" ] || die "say which StreamConsumers: --namespace NS or --all-namespaces"
[ -z "$release" ] || [ -n "$release_ns" ] || die "--release needs --release-namespace"

# namespace/name of each StreamConsumer in scope.
consumers() {
  "$KUBECTL" get streamconsumers "${scope[@]}" --ignore-not-found \
    -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name}{"\n"}{end}'
}

# 1. Delete the consumers; the operator deletes tables under deletionPolicy: Delete (only those its tags
#    prove it created) and keeps the others.
if "$KUBECTL" get crd "$CRD" >/dev/null 2>&1; then
  say "deleting the StreamConsumers (${scope[*]})"
  "$KUBECTL" delete streamconsumers "${scope[@]}" --all --wait=false
  deadline=$((SECONDS + timeout))
  while [ -n "$(consumers)" ] && [ $SECONDS -lt $deadline ]; do sleep 1; done

  # 2. Whatever is left is held by the finalizer: the operator is gone or cannot finish (see the
  #    resource's events). Clearing the finalizer lets it go; its table is then KEPT whatever its
  #    deletionPolicy says: delete it yourself (aws dynamodb delete-table --table-name NAME).
  for item in $(consumers); do
    ns="${item%%/*}" name="${item#*/}"
    table="$("$KUBECTL" get streamconsumer "$name" -n "$ns" -o jsonpath='{.spec.leaseTable.name}' 2>/dev/null || true)"
    say "$item is still held by $FINALIZER: clearing it; its lease table ${table:-(none)} is kept"
    "$KUBECTL" patch streamconsumer "$name" -n "$ns" --type=json \
      -p '[{"op":"remove","path":"/metadata/finalizers"}]' >/dev/null
  done
  deadline=$((SECONDS + 30))
  while [ -n "$(consumers)" ] && [ $SECONDS -lt $deadline ]; do sleep 1; done
  [ -z "$(consumers)" ] || die "StreamConsumers remain: $(consumers | tr '\n' ' ')"
fi

# 3. The operator (its Deployment, RBAC, ServiceAccount; Helm leaves the CRD).
if [ -n "$release" ]; then
  say "uninstalling the Helm release $release ($release_ns)"
  "$HELM" uninstall "$release" --namespace "$release_ns"
fi

# 4. The CRD (Helm never deletes CRDs it installed from crds/).
if [ $keep_crd -eq 0 ]; then
  say "deleting the CRD $CRD"
  "$KUBECTL" delete crd "$CRD" --ignore-not-found
fi
say "done"
