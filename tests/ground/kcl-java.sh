#!/usr/bin/env bash
# The real Java KCL MultiLangDaemon, for side-by-side measurements with the worker's multilang processor
# and the KCL import test.
#   kcl-java.sh install   install a JDK and Maven from Debian's packages when missing (default-jdk-headless,
#                         maven), then fetch amazon-kinesis-client-multilang and its dependency tree from
#                         Maven Central into $LEASEHOLD_CACHE/kcl-java/<version>/jars (idempotent); prints the dir
#   kcl-java.sh classpath print the classpath ('<jars>/*')
# KCL_VERSION picks the version. amazon_kclpy 3.2.0 names 3.5.3, but the Maven Central reachable here
# serves amazon-kinesis-client-multilang only in 2.2.0, 2.5.4 and 3.1.3. The default is 2.5.4 (on dynalite);
# KCL_VERSION=3.1.3 fetches the KCL 3.x, whose lease-table GSI dynalite refuses: it keeps its tables on the
# separate moto of tests/ground/moto-kcl.sh (docs/testing.md, "The Java KCL 3.x").
source "$(dirname "$0")/common.sh"
KCL_VERSION="${KCL_VERSION:-2.5.4}"
BASE="$LEASEHOLD_CACHE/kcl-java/$KCL_VERSION"
JARS="$BASE/jars"

# A JDK and Maven from Debian when missing: CI machines may have neither. The .debs are cached.
install_tools() {
  local missing=()
  command -v java >/dev/null || missing+=(default-jdk-headless)
  command -v mvn >/dev/null || missing+=(maven)
  [ ${#missing[@]} -eq 0 ] && return 0
  command -v apt-get >/dev/null || die "apt-get not found: install a JDK (17+) and Maven by hand (${missing[*]})"
  log "installing ${missing[*]} from Debian's packages"
  mkdir -p "$LEASEHOLD_CACHE/debs/partial"
  local apt=(apt-get -q -y --no-install-recommends -o "Dir::Cache::archives=$LEASEHOLD_CACHE/debs")
  # A machine that never ran apt-get update has no package lists: update once, then try again.
  if ! DEBIAN_FRONTEND=noninteractive "${apt[@]}" install "${missing[@]}" >&2; then
    apt-get -q update >&2 || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive "${apt[@]}" install "${missing[@]}" >&2 || die "apt-get install ${missing[*]} failed"
  fi
  command -v java >/dev/null || die "java is still missing after installing default-jdk-headless"
  command -v mvn >/dev/null || die "mvn is still missing after installing maven"
}

install() {
  install_tools
  if [ -f "$JARS/.complete" ]; then echo "$JARS"; return; fi
  mkdir -p "$BASE"
  cat > "$BASE/pom.xml" <<POM
<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>leasehold.ground</groupId>
  <artifactId>kcl-java</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>software.amazon.kinesis</groupId>
      <artifactId>amazon-kinesis-client-multilang</artifactId>
      <version>$KCL_VERSION</version>
    </dependency>
  </dependencies>
</project>
POM
  log "fetching amazon-kinesis-client-multilang $KCL_VERSION and dependencies with Maven"
  rm -rf "$JARS"
  mvn -q -B -f "$BASE/pom.xml" dependency:copy-dependencies -DincludeScope=runtime \
    -DoutputDirectory="$JARS" >&2 || die "maven could not fetch the KCL jars"
  ls "$JARS"/amazon-kinesis-client-multilang-*.jar >/dev/null || die "multilang jar missing after maven"
  touch "$JARS/.complete"
  echo "$JARS"
}

case "${1:-}" in
  install) install ;;
  classpath) install >/dev/null; echo "$JARS/*" ;;
  *) echo "usage: $0 install|classpath" >&2; exit 2 ;;
esac
