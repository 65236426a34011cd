#!/usr/bin/env bash
# A real Kubernetes control plane on loopback, without containers: etcd, kube-apiserver and
# kube-controller-manager as local processes. Without a node, Pods stay Pending; Deployments still get
# ReplicaSets and Pods, RBAC and admission (PodSecurity) are real. tests/ground/node.sh adds a real node
# (kubelet, containerd, kube-proxy, kube-scheduler): for it the API server authorizes Node,RBAC with
# NodeRestriction, holds a client certificate for the kubelet (logs, exec) and advertises the host end
# of the node's veth pair ($NODE_HOST_IP, common.sh), so the `kubernetes` Service leads to it.
#
#   tests/ground/control-plane.sh install   # build/fetch the binaries into $LEASEHOLD_CACHE/k8s-bin (idempotent)
#   tests/ground/control-plane.sh start     # install if needed, start on free loopback ports, wait for /readyz
#   tests/ground/control-plane.sh stop      # stop all three by PID
#   tests/ground/control-plane.sh status    # exit 0 and print the kubeconfig path if running
#   tests/ground/control-plane.sh env       # print `export KUBECONFIG=...` (and PATH with kubectl/helm)
#
# Binaries (cached outside the clone, keyed by version stamps):
#   kube-apiserver, kube-controller-manager, kubectl  built from the Go module proxy (wrapper module)
#   helm                                              go install helm.sh/helm/v3/cmd/helm
#   etcd                                              Debian trixie's etcd-server package (dpkg-deb -x)
# Run state (certificates, kubeconfig, logs, etcd data) lives in $LEASEHOLD_STATE/control-plane and
# the PIDs and ports in $LEASEHOLD_STATE/control-plane.env.
source "$(dirname "$0")/common.sh"

K8S_VERSION=1.34.2
HELM_VERSION=3.21.4
ETCD_SERIES=3.5 # Kubernetes 1.34 needs etcd >= 3.5.11; trixie ships 3.5.16
ETCD_SUITE=trixie
DEBIAN_MIRROR="${LEASEHOLD_DEBIAN_MIRROR:-http://deb.debian.org/debian}"

BIN="$LEASEHOLD_CACHE/k8s-bin"
BUILD_DIR="$LEASEHOLD_CACHE/k8s-build"
CP="$LEASEHOLD_STATE/control-plane"
PKI="$CP/pki"
KUBECONFIG_FILE="$CP/kubeconfig"
STATE_FILE="$LEASEHOLD_STATE/control-plane.env"
SERVICE_CIDR=10.96.0.0/16
READY_TIMEOUT="${LEASEHOLD_CONTROL_PLANE_TIMEOUT:-60}"

# ---------------------------------------------------------------------------------------------
# install

need() { command -v "$1" >/dev/null || die "$1 is not installed ($2)"; }

install_kube() {
  local stamp="$BIN/.kube-v$K8S_VERSION"
  if [ -f "$stamp" ] && [ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/kube-controller-manager" ] &&
    [ -x "$BIN/kubectl" ]; then return 0; fi
  need go "Go 1.24+ is needed: tests/ground/install-toolchain.sh or https://go.dev/dl"
  need jq "apt-get install jq"
  local v="$K8S_VERSION" s="0.${K8S_VERSION#1.}" started=$SECONDS
  log "building kube-apiserver, kube-controller-manager and kubectl v$v (cold: 10-15 min on 2 cores)"
  # k8s.io/kubernetes pins its staging modules (k8s.io/api, k8s.io/apiserver, ...) with
  # `replace => ./staging/...`, which only work inside its own tree. A wrapper module replaces each
  # of them with the published v0.x.y tag of the same release.
  rm -rf "$BUILD_DIR"
  mkdir -p "$BUILD_DIR/out" "$BIN"
  local gomod m pkg ldflags="" minor="${v#1.}"
  minor="${minor%%.*}"
  local -x GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=mod"
  go -C "$BUILD_DIR" mod init kbin 2>/dev/null || die "go mod init failed in $BUILD_DIR"
  go -C "$BUILD_DIR" mod edit -require="k8s.io/kubernetes@v$v"
  gomod="$(go -C "$BUILD_DIR" mod download -json "k8s.io/kubernetes@v$v" | jq -r .GoMod)"
  [ -f "$gomod" ] || die "go mod download k8s.io/kubernetes@v$v failed"
  for m in $(sed -n 's|^\s*\(k8s.io/[^ ]*\) => ./staging/.*|\1|p' "$gomod"); do
    go -C "$BUILD_DIR" mod edit -replace="$m=$m@v$s"
  done
  go -C "$BUILD_DIR" get "k8s.io/kubernetes/cmd/kube-apiserver@v$v" \
    "k8s.io/kubernetes/cmd/kube-controller-manager@v$v" "k8s.io/kubernetes/cmd/kubectl@v$v" >&2 ||
    die "go get k8s.io/kubernetes@v$v failed (wrapper module in $BUILD_DIR)"
  # The same variables hack/lib/version.sh sets, for the server and the client side.
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=v$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  CGO_ENABLED=0 nice -n 10 go -C "$BUILD_DIR" build -trimpath -ldflags "-s -w$ldflags" -o out/ \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kubectl >&2 || die "go build of Kubernetes v$v failed (wrapper module in $BUILD_DIR)"
  mv -f "$BUILD_DIR/out/kube-apiserver" "$BUILD_DIR/out/kube-controller-manager" "$BUILD_DIR/out/kubectl" "$BIN/"
  rm -f "$BIN"/.kube-v*
  touch "$stamp"
  rm -rf "$BUILD_DIR"
  log "kube binaries v$v built in $((SECONDS - started)) s"
}

install_helm() {
  local stamp="$BIN/.helm-v$HELM_VERSION"
  if [ -f "$stamp" ] && [ -x "$BIN/helm" ]; then return 0; fi
  need go "Go 1.24+ is needed"
  log "building helm v$HELM_VERSION"
  mkdir -p "$BIN"
  GOBIN="$BIN" CGO_ENABLED=0 nice -n 10 go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean" \
    "helm.sh/helm/v3/cmd/helm@v$HELM_VERSION" >&2 || die "go install helm v$HELM_VERSION failed"
  rm -f "$BIN"/.helm-v*
  touch "$stamp"
}

install_etcd() {
  if compgen -G "$BIN/.etcd-$ETCD_SERIES.*" >/dev/null && [ -x "$BIN/etcd" ]; then return 0; fi
  need apt-get "a Debian-based system is needed for the etcd package"
  need dpkg-deb "a Debian-based system is needed for the etcd package"
  log "fetching etcd-server from Debian $ETCD_SUITE"
  # A private apt root: its own sources list, lists and cache, so the machine's apt config is untouched.
  local tmp
  tmp="$(mktemp -d)"
  mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial" "$tmp/deb"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $DEBIAN_MIRROR $ETCD_SUITE main" \
    > "$tmp/sources.list"
  local apt=(apt-get -q -o "Dir::Etc::sourcelist=$tmp/sources.list" -o Dir::Etc::sourceparts=-
    -o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache=$tmp/cache" -o APT::Get::List-Cleanup=0 -o APT::Sandbox::User=root
    -o Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false)
  "${apt[@]}" update >&2 || { rm -rf "$tmp"; die "apt-get update for Debian $ETCD_SUITE failed"; }
  (cd "$tmp/deb" && "${apt[@]}" download etcd-server >&2) ||
    { rm -rf "$tmp"; die "apt-get download etcd-server ($ETCD_SUITE) failed"; }
  local deb version
  deb="$(ls "$tmp"/deb/etcd-server_*.deb)"
  version="$(dpkg-deb -f "$deb" Version)"
  case "$version" in
    "$ETCD_SERIES".*) ;;
    *) rm -rf "$tmp"; die "Debian $ETCD_SUITE has etcd-server $version, expected $ETCD_SERIES.x" ;;
  esac
  dpkg-deb -x "$deb" "$tmp/root"
  [ -x "$tmp/root/usr/bin/etcd" ] || { rm -rf "$tmp"; die "etcd-server $version has no usr/bin/etcd"; }
  mkdir -p "$BIN"
  mv -f "$tmp/root/usr/bin/etcd" "$BIN/etcd"
  rm -rf "$tmp"
  "$BIN/etcd" --version >/dev/null 2>&1 || die "$BIN/etcd does not run here (ldd $BIN/etcd)"
  rm -f "$BIN"/.etcd-*
  touch "$BIN/.etcd-${version%%-*}"
  log "etcd $version installed"
}

install() {
  install_etcd
  install_helm
  install_kube
}

# ---------------------------------------------------------------------------------------------
# certificates and kubeconfig

pki() {
  if [ -f "$PKI/ca.crt" ] && [ -f "$PKI/apiserver.crt" ] && [ -f "$PKI/admin.crt" ] &&
    [ -f "$PKI/controller-manager.crt" ] && [ -f "$PKI/front-proxy-client.crt" ] && [ -f "$PKI/sa.key" ]; then
    # Added with node support: issued by the existing CA, so earlier kubeconfigs stay valid.
    [ -f "$PKI/apiserver-kubelet-client.crt" ] || issue_cert apiserver-kubelet-client \
      "/O=system:masters/CN=kube-apiserver-kubelet-client" "$CLIENT_EXT"
    return 0
  fi
  need openssl "apt-get install openssl"
  rm -rf "$PKI"
  mkdir -p "$PKI"
  chmod 700 "$PKI"
  local ca
  # ca signs the serving and client certificates; front-proxy-ca only the aggregation-layer proxy client
  # (requestheader authentication), as kubeadm does.
  for ca in ca front-proxy-ca; do
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -keyout "$PKI/$ca.key" -out "$PKI/$ca.crt" \
      -subj "/CN=leasehold-$ca" -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null || die "openssl: $ca failed"
  done
  issue_cert apiserver "/CN=kube-apiserver" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost,IP:10.96.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  local client="$CLIENT_EXT"
  issue_cert admin "/O=system:masters/CN=leasehold-admin" "$client"
  issue_cert controller-manager "/CN=system:kube-controller-manager" "$client"
  issue_cert front-proxy-client "/CN=front-proxy-client" "$client" front-proxy-ca
  # The API server's identity towards the kubelet (logs, exec, port-forward).
  issue_cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$client"
  openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null || die "openssl: service-account key failed"
  openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null || die "openssl: service-account key failed"
  chmod 600 "$PKI"/*.key
}

CLIENT_EXT="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"

issue_cert() { # name subject extensions [ca]; signed by $PKI/ca unless another CA is named
  local k="$PKI/$1" ca="$PKI/${4:-ca}"
  openssl req -newkey rsa:2048 -nodes -keyout "$k.key" -out "$k.csr" -subj "$2" 2>/dev/null ||
    die "openssl: $1 request failed"
  printf '%s\n' "$3" > "$k.ext"
  openssl x509 -req -in "$k.csr" -CA "$ca.crt" -CAkey "$ca.key" -CAcreateserial -days 3650 \
    -extfile "$k.ext" -out "$k.crt" 2>/dev/null || die "openssl: signing $1 failed"
  rm -f "$k.csr" "$k.ext"
}

b64() { base64 -w0 < "$1"; }

kubeconfig() { # file user port
  cat > "$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: leasehold
  cluster:
    server: https://127.0.0.1:$3
    certificate-authority-data: $(b64 "$PKI/ca.crt")
users:
- name: $2
  user:
    client-certificate-data: $(b64 "$PKI/$2.crt")
    client-key-data: $(b64 "$PKI/$2.key")
contexts:
- name: leasehold
  context:
    cluster: leasehold
    user: $2
current-context: leasehold
EOF
  chmod 600 "$1"
}

# ---------------------------------------------------------------------------------------------
# start / stop

load_state() {
  [ -f "$STATE_FILE" ] || return 1
  # shellcheck disable=SC1090
  source "$STATE_FILE"
}

readyz() { # port
  curl -sf --max-time 3 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
    "https://127.0.0.1:$1/readyz" >/dev/null 2>&1
}

running() {
  load_state || return 1
  pid_alive "${ETCD_PID:-}" && pid_alive "${APISERVER_PID:-}" && pid_alive "${CONTROLLER_MANAGER_PID:-}" &&
    readyz "$APISERVER_PORT"
}

# Starts "$@" detached in its own session, output to log $1, and prints its PID.
spawn() { # logname cmd...
  local name="$1"; shift
  setsid "$@" >"$CP/$name.log" 2>&1 </dev/null 9>&- &
  echo $!
}

fail() { # message
  local msg="$1"
  stop quiet
  die "$msg; logs: $CP/etcd.log $CP/kube-apiserver.log $CP/kube-controller-manager.log"
}

start() {
  if running; then
    log "control plane already running: https://127.0.0.1:$APISERVER_PORT (KUBECONFIG=$KUBECONFIG_FILE)"
    return 0
  fi
  stop quiet
  install
  need curl "apt-get install curl"
  mkdir -p "$CP"
  pki
  rm -rf "$CP/etcd-data" "$CP/controller-manager-certs" "$CP/flexvolume"

  local etcd_port peer_port api_port kcm_port
  etcd_port="$(free_port)"; peer_port="$(free_port)"; api_port="$(free_port)"; kcm_port="$(free_port)"
  while [ "$peer_port" = "$etcd_port" ]; do peer_port="$(free_port)"; done
  while [ "$api_port" = "$etcd_port" ] || [ "$api_port" = "$peer_port" ]; do api_port="$(free_port)"; done
  while [ "$kcm_port" = "$etcd_port" ] || [ "$kcm_port" = "$peer_port" ] || [ "$kcm_port" = "$api_port" ]; do
    kcm_port="$(free_port)"
  done
  kubeconfig "$KUBECONFIG_FILE" admin "$api_port"
  kubeconfig "$CP/controller-manager.kubeconfig" controller-manager "$api_port"

  local etcd_pid api_pid kcm_pid
  etcd_pid="$(spawn etcd "$BIN/etcd" --name leasehold --data-dir "$CP/etcd-data" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "leasehold=http://127.0.0.1:$peer_port" --initial-cluster-state new \
    --unsafe-no-fsync --log-level warn)"
  write_state "$etcd_pid" "" "" "$etcd_port" "$peer_port" "$api_port" "$kcm_port"

  local i
  for i in $(seq 1 100); do
    curl -sf --max-time 2 "http://127.0.0.1:$etcd_port/health" >/dev/null 2>&1 && break
    pid_alive "$etcd_pid" || fail "etcd exited during start"
    [ "$i" = 100 ] && fail "etcd did not answer on 127.0.0.1:$etcd_port within 20 s"
    sleep 0.2
  done

  api_pid="$(spawn kube-apiserver "$BIN/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address 127.0.0.1 --secure-port "$api_port" --cert-dir "$CP" \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --client-ca-file "$PKI/ca.crt" \
    --requestheader-client-ca-file "$PKI/front-proxy-ca.crt" --requestheader-allowed-names front-proxy-client \
    --requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
    --requestheader-extra-headers-prefix X-Remote-Extra- \
    --proxy-client-cert-file "$PKI/front-proxy-client.crt" --proxy-client-key-file "$PKI/front-proxy-client.key" \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --advertise-address "$NODE_HOST_IP" \
    --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
    --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types InternalIP)"
  write_state "$etcd_pid" "$api_pid" "" "$etcd_port" "$peer_port" "$api_port" "$kcm_port"

  # The controller manager starts once /readyz is ok: before that its identity has no RBAC roles yet
  # (the bootstrap-roles post-start hook) and it exits.
  local deadline=$((SECONDS + READY_TIMEOUT))
  until readyz "$api_port"; do
    pid_alive "$etcd_pid" || fail "etcd exited during start"
    pid_alive "$api_pid" || fail "kube-apiserver exited during start"
    [ $SECONDS -lt $deadline ] || fail "kube-apiserver /readyz not ok within $READY_TIMEOUT s"
    sleep 0.5
  done

  kcm_pid="$(spawn kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig "$CP/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$CP/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$CP/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$kcm_port" --cert-dir "$CP/controller-manager-certs" \
    --leader-elect=false --controllers '*' --use-service-account-credentials \
    --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
    --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" --flex-volume-plugin-dir "$CP/flexvolume")"
  write_state "$etcd_pid" "$api_pid" "$kcm_pid" "$etcd_port" "$peer_port" "$api_port" "$kcm_port"

  # The controller manager works once it has created the default ServiceAccount (without it, Pods
  # in a namespace are not admitted).
  until curl -sf --max-time 3 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
    "https://127.0.0.1:$api_port/api/v1/namespaces/default/serviceaccounts/default" >/dev/null 2>&1; do
    pid_alive "$etcd_pid" || fail "etcd exited during start"
    pid_alive "$api_pid" || fail "kube-apiserver exited during start"
    pid_alive "$kcm_pid" || fail "kube-controller-manager exited during start"
    [ $SECONDS -lt $deadline ] ||
      fail "kube-controller-manager did not create the default ServiceAccount within $READY_TIMEOUT s"
    sleep 0.5
  done
  log "control plane ready in $((SECONDS - deadline + READY_TIMEOUT)) s: https://127.0.0.1:$api_port" \
    "(etcd :$etcd_port, controller-manager :$kcm_port)"
  log "KUBECONFIG=$KUBECONFIG_FILE"
}

write_state() { # etcd_pid api_pid kcm_pid etcd_port peer_port api_port kcm_port
  cat > "$STATE_FILE" <<STATE
ETCD_PID=$1
APISERVER_PID=$2
CONTROLLER_MANAGER_PID=$3
ETCD_PORT=$4
ETCD_PEER_PORT=$5
APISERVER_PORT=$6
CONTROLLER_MANAGER_PORT=$7
APISERVER_URL=https://127.0.0.1:$6
KUBECONFIG=$KUBECONFIG_FILE
# Started with what tests/ground/node.sh needs (Node authorization, kubelet client certificate,
# advertised at the node's veth).
NODE_SUPPORT=$NODE_HOST_IP
CONTROL_PLANE_DIR=$CP
K8S_BIN=$BIN
STATE
}

# Stops one process by PID, but only if it still runs one of our binaries (PIDs can be reused).
stop_pid() { # pid
  local pid="$1" exe i
  pid_alive "$pid" || return 0
  exe="$(readlink "/proc/$pid/exe" 2>/dev/null || true)"
  case "$exe" in "$BIN"/*) ;; *) return 0 ;; esac
  kill "$pid" 2>/dev/null || true
  for i in $(seq 1 100); do pid_alive "$pid" || return 0; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
}

stop() {
  if load_state; then
    stop_pid "${CONTROLLER_MANAGER_PID:-}"
    stop_pid "${APISERVER_PID:-}"
    stop_pid "${ETCD_PID:-}"
    rm -f "$STATE_FILE"
    [ "${1:-}" = quiet ] || log "control plane stopped"
  fi
}

# One start or stop at a time (test binaries may all call `start`). fd 9 is closed for the spawned
# processes, so the lock is released when this script exits.
lock() {
  need flock "apt-get install util-linux"
  exec 9>"$LEASEHOLD_STATE/control-plane.lock"
  flock -w 900 9 || die "another control-plane.sh holds $LEASEHOLD_STATE/control-plane.lock"
}

case "${1:-}" in
  install) lock; install ;;
  start) lock; start ;;
  stop) lock; stop ;;
  status) if running; then echo "$KUBECONFIG_FILE"; exit 0; fi
          echo "control plane not running" >&2; exit 1 ;;
  env) running || die "control plane not running: run tests/ground/control-plane.sh start"
       echo "export KUBECONFIG=$KUBECONFIG_FILE"
       echo "export PATH=$BIN:\$PATH" ;;
  *) echo "usage: $0 install|start|stop|status|env" >&2; exit 2 ;;
esac
