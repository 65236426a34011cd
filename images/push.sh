#!/usr/bin/env bash
# Pushes the project's images (the OCI archives `make images` writes to $LEASEHOLD_CACHE/images) to a
# registry of yours, then prints the chart values that name them. Nothing is published for you: the
# chart's defaults (ghcr.io/leasehold/*) are only the names `make images` tags its archives with.
#
#   images/push.sh REGISTRY            # e.g. 123456789012.dkr.ecr.eu-west-1.amazonaws.com/leasehold,
#                                      #      ghcr.io/you, localhost:5000 (kind's local registry)
#   images/push.sh --dry-run REGISTRY  # print the commands, push nothing
#
# REGISTRY/operator:<version> and REGISTRY/worker:<version> are pushed (<version>: the chart's
# appVersion, as `make images` tags them). Log in first with the registry's own tool (`aws ecr
# get-login-password | skopeo login --username AWS --password-stdin ...`, `skopeo login ghcr.io`).
# Copies with skopeo (Debian: apt-get install skopeo), else crane, whichever is on PATH.
# LEASEHOLD_PUSH_TOOL=skopeo|crane picks one; LEASEHOLD_PUSH_TLS_VERIFY=false for a plain-HTTP registry.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${LEASEHOLD_CACHE:-$HOME/.cache/leasehold}"
IMAGES="$CACHE/images"
VERSION="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$ROOT/charts/leasehold/Chart.yaml")"

die() { echo "push.sh: $*" >&2; exit 1; }

dry_run=0
if [ "${1:-}" = "--dry-run" ]; then dry_run=1; shift; fi
[ $# -eq 1 ] && [ -n "$1" ] || die "usage: $0 [--dry-run] REGISTRY (e.g. ghcr.io/you or localhost:5000/leasehold)"
registry="${1%/}"
case "$registry" in
  *://*) die "REGISTRY is a host and path, without a scheme: $registry" ;;
  *[[:space:]]*) die "REGISTRY has a space: $registry" ;;
esac
[ -n "$VERSION" ] || die "no appVersion in charts/leasehold/Chart.yaml"

tool="${LEASEHOLD_PUSH_TOOL:-}"
if [ -z "$tool" ]; then
  if command -v skopeo >/dev/null; then tool=skopeo
  elif command -v crane >/dev/null; then tool=crane
  else tool=skopeo
  fi
fi
tls="${LEASEHOLD_PUSH_TLS_VERIFY:-true}"

# The command that copies the OCI archive $1 to the reference $2.
copy_command() {
  case "$tool" in
    skopeo) echo "skopeo copy --dest-tls-verify=$tls oci-archive:$1 docker://$2" ;;
    crane)
      local insecure=""
      [ "$tls" = "false" ] && insecure=" --insecure"
      echo "crane push$insecure $1 $2"
      ;;
    *) die "LEASEHOLD_PUSH_TOOL is skopeo or crane, not $tool" ;;
  esac
}

for component in operator worker; do
  archive="$IMAGES/$component.tar"
  [ -f "$archive" ] || die "$archive is missing: run \`make images\` first"
  command="$(copy_command "$archive" "$registry/$component:$VERSION")"
  if [ $dry_run -eq 1 ]; then
    echo "$command"
  else
    command -v "$tool" >/dev/null || die "$tool is not on PATH (Debian: apt-get install skopeo)"
    echo "pushing $registry/$component:$VERSION" >&2
    $command >&2
  fi
done
echo "# chart values for these images:"
echo "helm install leasehold charts/leasehold --set image.repository=$registry/operator --set workerImage.repository=$registry/worker"
