#!/usr/bin/env bash
# A real Kubernetes node for the test ground: containerd + runc + the CNI plugins (Debian packages),
# kubelet, kube-scheduler and kube-proxy (built like the control plane's binaries), joined to the local
# control plane (tests/ground/control-plane.sh), in a network namespace of its own.
#
#   tests/ground/node.sh install   # packages and binaries (idempotent, cached in $LEASEHOLD_CACHE)
#   tests/ground/node.sh start     # install if needed, start the node and wait until it is Ready
#   tests/ground/node.sh stop      # stop by PID and leave the machine as found
#   tests/ground/node.sh status    # exit 0 and print the node's state file if running
#   tests/ground/node.sh env       # print `export ...` lines (NODE_NETNS, CONTAINERD_ADDRESS, ...)
#
# Network rule: nothing here listens on or sends to the machine's external interface. The node lives
# in the network namespace $NETNS; a veth pair with private /30 addresses ($HOST_IP on the host side,
# $NODE_IP in the namespace) is its only link. The control plane and the emulators stay on 127.0.0.1:
# a forwarder (tcp-forward.js) listens on $HOST_IP (the veth, never eth0) and relays to them, and the
# API server advertises $HOST_IP so the `kubernetes` Service leads there. The API server reaches the
# kubelet at $NODE_IP over the same veth. Pod traffic is masqueraded inside the namespace only.
source "$(dirname "$0")/common.sh"

K8S_VERSION=1.34.2 # same release as the control plane
GROUND_DIR="$(cd "$(dirname "$0")" && pwd)"
BIN="$LEASEHOLD_CACHE/k8s-bin"
NODE_BUILD_DIR="$LEASEHOLD_CACHE/k8s-build-node"
DEB_CACHE="$LEASEHOLD_CACHE/debs"
NODE_PKGS=(containerd runc containernetworking-plugins iptables conntrack)

need() { command -v "$1" >/dev/null || die "$1 is not installed ($2)"; }

# ---------------------------------------------------------------------------------------------
# install

install_packages() {
  local p missing=()
  for p in "${NODE_PKGS[@]}"; do
    dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  need apt-get "a Debian-based system is needed for containerd, runc and the CNI plugins"
  log "installing ${missing[*]} from Debian (.debs cached in $DEB_CACHE)"
  mkdir -p "$DEB_CACHE/partial"
  local apt=(apt-get -q -y --no-install-recommends -o "Dir::Cache::archives=$DEB_CACHE")
  # The packages' service units are not started: this machine has no systemd, and nothing may start a
  # containerd outside the node's namespace.
  if ! DEBIAN_FRONTEND=noninteractive "${apt[@]}" install "${missing[@]}" >&2; then
    apt-get -q update >&2 || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive "${apt[@]}" install "${missing[@]}" >&2 ||
      die "apt-get install ${missing[*]} failed"
  fi
}

install_kube() {
  local stamp="$BIN/.node-v$K8S_VERSION"
  if [ -f "$stamp" ] && [ -x "$BIN/kubelet" ] && [ -x "$BIN/kube-scheduler" ] && [ -x "$BIN/kube-proxy" ]; then
    return 0
  fi
  need go "Go 1.24+ is needed: tests/ground/install-toolchain.sh"
  need jq "apt-get install jq"
  local v="$K8S_VERSION" s="0.${K8S_VERSION#1.}" started=$SECONDS
  log "building kubelet, kube-scheduler and kube-proxy v$v (3 min cold, 1 min on a warm Go cache)"
  # The wrapper module of control-plane.sh: each staging module replaced by its published tag.
  rm -rf "$NODE_BUILD_DIR"
  mkdir -p "$NODE_BUILD_DIR/out" "$BIN"
  local gomod m pkg ldflags="" minor="${v#1.}"
  minor="${minor%%.*}"
  local -x GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=mod"
  go -C "$NODE_BUILD_DIR" mod init kbin 2>/dev/null || die "go mod init failed in $NODE_BUILD_DIR"
  go -C "$NODE_BUILD_DIR" mod edit -require="k8s.io/kubernetes@v$v"
  gomod="$(go -C "$NODE_BUILD_DIR" mod download -json "k8s.io/kubernetes@v$v" | jq -r .GoMod)"
  [ -f "$gomod" ] || die "go mod download k8s.io/kubernetes@v$v failed"
  for m in $(sed -n 's|^\s*\(k8s.io/[^ ]*\) => ./staging/.*|\1|p' "$gomod"); do
    go -C "$NODE_BUILD_DIR" mod edit -replace="$m=$m@v$s"
  done
  go -C "$NODE_BUILD_DIR" get "k8s.io/kubernetes/cmd/kubelet@v$v" "k8s.io/kubernetes/cmd/kube-scheduler@v$v" \
    "k8s.io/kubernetes/cmd/kube-proxy@v$v" >&2 || die "go get k8s.io/kubernetes@v$v failed ($NODE_BUILD_DIR)"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=v$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  CGO_ENABLED=0 nice -n 10 go -C "$NODE_BUILD_DIR" build -trimpath -ldflags "-s -w$ldflags" -o out/ \
    k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-proxy >&2 ||
    die "go build of the node binaries v$v failed ($NODE_BUILD_DIR)"
  mv -f "$NODE_BUILD_DIR/out/kubelet" "$NODE_BUILD_DIR/out/kube-scheduler" "$NODE_BUILD_DIR/out/kube-proxy" "$BIN/"
  rm -f "$BIN"/.node-v*
  touch "$stamp"
  rm -rf "$NODE_BUILD_DIR"
  log "node binaries v$v built in $((SECONDS - started)) s"
}

install() {
  install_packages
  install_kube
}

# ---------------------------------------------------------------------------------------------
# layout

ND="$LEASEHOLD_STATE/node"                 # run state: configs, certificates, logs, containerd and kubelet roots
STATE_FILE="$LEASEHOLD_STATE/node.env"
CP_STATE="$LEASEHOLD_STATE/control-plane.env"
EMU_STATE="$LEASEHOLD_STATE/emulators.env"
PKI="$LEASEHOLD_STATE/control-plane/pki"   # the control plane's CA signs the node's certificates
SOCK="$ND/containerd.sock"
CGROUP_ROOT="/leasehold-node-$NODE_INDEX"
POD_CIDR=10.244.0.0/24
CLUSTER_CIDR=10.244.0.0/16
IMAGES_DIR="$LEASEHOLD_CACHE/images"
PAUSE_IMAGE=leasehold.local/pause:3.10
READY_TIMEOUT="${LEASEHOLD_NODE_TIMEOUT:-90}"
# Host settings the kubelet changes (it enforces its kernel defaults); stop puts them back.
HOST_SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys
  kernel.keys.root_maxbytes)

ctr_() { ctr --address "$SOCK" -n k8s.io "$@"; }
in_netns() { nsenter --net="/run/netns/$NODE_NETNS" -- "$@"; }

load_state() {
  [ -f "$STATE_FILE" ] || return 1
  # shellcheck disable=SC1090
  source "$STATE_FILE"
}

kubectl_() { "$BIN/kubectl" --kubeconfig "$LEASEHOLD_STATE/control-plane/kubeconfig" "$@"; }

node_ready() {
  [ "$(kubectl_ get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

running() {
  load_state || return 1
  pid_alive "${CONTAINERD_PID:-}" && pid_alive "${KUBELET_PID:-}" && pid_alive "${KUBE_PROXY_PID:-}" &&
    pid_alive "${SCHEDULER_PID:-}" && pid_alive "${FORWARD_PID:-}" && node_ready
}

# The ports the forwarder must relay: the API server's and the emulators' (as they run now).
wanted_ports() {
  local ports
  ports="$(sed -n 's/^APISERVER_PORT=//p' "$CP_STATE")"
  if [ -f "$EMU_STATE" ]; then
    ports+=" $(sed -n 's/^\(KINESALITE\|DYNALITE\|KINESIS_MOCK\)_PORT=//p' "$EMU_STATE" | tr '\n' ' ')"
  fi
  echo $ports
}

# ---------------------------------------------------------------------------------------------
# certificates, kubeconfigs, configs

issue_cert() { # name subject [san]
  local k="$ND/pki/$1" ext="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=${3:+serverAuth,}clientAuth${3:+
subjectAltName=$3}"
  [ -f "$k.crt" ] && openssl verify -CAfile "$PKI/ca.crt" "$k.crt" >/dev/null 2>&1 && return 0
  openssl req -newkey rsa:2048 -nodes -keyout "$k.key" -out "$k.csr" -subj "$2" 2>/dev/null ||
    die "openssl: $1 request failed"
  printf '%s\n' "$ext" > "$k.ext"
  openssl x509 -req -in "$k.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial -days 3650 \
    -extfile "$k.ext" -out "$k.crt" 2>/dev/null || die "openssl: signing $1 failed"
  rm -f "$k.csr" "$k.ext"
  chmod 600 "$k.key"
}

kubeconfig() { # file cert server [tls-server-name]
  cat > "$1" <<KC
apiVersion: v1
kind: Config
clusters:
- name: leasehold
  cluster:
    server: $3
    certificate-authority: $PKI/ca.crt
${4:+    tls-server-name: $4}
users:
- name: $2
  user:
    client-certificate: $ND/pki/$2.crt
    client-key: $ND/pki/$2.key
contexts:
- name: leasehold
  context: {cluster: leasehold, user: $2}
current-context: leasehold
KC
  chmod 600 "$1"
}

write_configs() { # api_port
  local api_port="$1"
  mkdir -p "$ND/pki" "$ND/cni/net.d" "$ND/cni/ipam" "$ND/netns" "$ND/run-containerd" "$ND/pod-logs"
  issue_cert kubelet "/O=system:nodes/CN=system:node:$NODE_NAME" "IP:$NODE_IP,DNS:$NODE_NAME"
  issue_cert kube-proxy "/CN=system:kube-proxy"
  issue_cert kube-scheduler "/CN=system:kube-scheduler"
  # Inside the namespace the API server is reached through the forwarder on the veth; its certificate
  # names `kubernetes`, not that address.
  kubeconfig "$ND/kubelet.kubeconfig" kubelet "https://$NODE_HOST_IP:$api_port" kubernetes
  kubeconfig "$ND/kube-proxy.kubeconfig" kube-proxy "https://$NODE_HOST_IP:$api_port" kubernetes
  kubeconfig "$ND/kube-scheduler.kubeconfig" kube-scheduler "https://127.0.0.1:$api_port"

  cat > "$ND/containerd.toml" <<TOML
version = 2
root = "$ND/containerd/root"
state = "$ND/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$ND/containerd.sock.ttrpc"
[debug]
  level = "warn"
[plugins."io.containerd.internal.v1.opt"]
  path = "$ND/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # The pod sandbox lacks CAP_SYS_RESOURCE here: without this every sandbox fails to start.
  restrict_oom_score_adj = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        Root = "$ND/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$ND/cni/net.d"
    max_conf_num = 1
TOML

  # A bridge in the node's namespace; pods reach the veth (and through it the forwarder) masqueraded
  # as the node. There is no default route: nothing in the namespace can reach another network.
  cat > "$ND/cni/net.d/10-leasehold.conflist" <<JSON
{"cniVersion": "1.0.0", "name": "leasehold", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": "$ND/cni/ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}}
]}
JSON

  # Pods resolve nothing (there is no cluster DNS, and no route out): every test address is an IP.
  printf '# leasehold test node: no DNS\noptions ndots:1\n' > "$ND/resolv.conf"

  cat > "$ND/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# cgroup v1 on this machine kind: allowed explicitly, cgroupfs, a root of our own in every hierarchy.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: $CGROUP_ROOT
containerRuntimeEndpoint: unix://$SOCK
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $ND/pki/kubelet.crt
tlsPrivateKeyFile: $ND/pki/kubelet.key
rotateCertificates: false
resolvConf: $ND/resolv.conf
podLogsDir: $ND/pod-logs
failSwapOn: false
# The disk is shared with everything else on the machine: evict only when it is really full, never
# collect the locally imported images (there is no registry to pull them back from). The disk
# thresholds are absolute: on a large shared disk 1% is gigabytes, and a build that left 2.5 GB of
# 252 GB free once made the kubelet delete the project's images in the middle of a make test run.
evictionHard: {memory.available: 100Mi, nodefs.available: 256Mi, imagefs.available: 256Mi, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
maxPods: 50
nodeStatusUpdateFrequency: 2s
syncFrequency: 10s
fileCheckFrequency: 10s
YAML

  cat > "$ND/kube-proxy.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $ND/kube-proxy.kubeconfig}
hostnameOverride: $NODE_NAME
mode: iptables
clusterCIDR: $CLUSTER_CIDR
bindAddress: $NODE_IP
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# Leave the machine-wide conntrack settings alone.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
iptables: {minSyncPeriod: 0s, syncPeriod: 30s}
YAML
}

# ---------------------------------------------------------------------------------------------
# start

spawn() { # logname cmd... ; prints the PID (every wrapper execs, so it is the program's own)
  local name="$1"; shift
  setsid "$@" >"$ND/$name.log" 2>&1 </dev/null 9>&- &
  echo $!
}

save_sysctls() {
  [ -f "$ND/sysctls.saved" ] && return 0
  local k
  for k in "${HOST_SYSCTLS[@]}"; do echo "$k=$(sysctl -n "$k")"; done > "$ND/sysctls.saved"
}

make_network() {
  ip netns list | grep -qw "^$NODE_NETNS" || ip netns add "$NODE_NETNS"
  if ! ip link show "$NODE_HOST_IF" >/dev/null 2>&1; then
    ip link add "$NODE_HOST_IF" type veth peer name "$NODE_IF"
    ip link set "$NODE_IF" netns "$NODE_NETNS"
    sysctl -qw "net.ipv6.conf.$NODE_HOST_IF.disable_ipv6=1" || true
    ip addr add "$NODE_HOST_IP/30" dev "$NODE_HOST_IF"
    ip link set "$NODE_HOST_IF" up
    ip -n "$NODE_NETNS" addr add "$NODE_IP/30" dev "$NODE_IF"
    ip -n "$NODE_NETNS" link set "$NODE_IF" up
    ip -n "$NODE_NETNS" link set lo up
  fi
}

make_cgroups() {
  local h dir
  for h in /sys/fs/cgroup/*/; do
    h="${h%/}"
    [ "$(stat -f -c %T "$h")" = cgroupfs ] || continue
    dir="$h$CGROUP_ROOT"
    mkdir -p "$dir"
    if [ -f "$h/cpuset.cpus" ]; then
      cat "$h/cpuset.cpus" > "$dir/cpuset.cpus"
      cat "$h/cpuset.mems" > "$dir/cpuset.mems"
    fi
  done
}

fail() {
  local msg="$1"
  stop quiet
  die "$msg; logs in $ND (containerd.log kubelet.log kube-proxy.log kube-scheduler.log forward.log)"
}

write_state() {
  cat > "$STATE_FILE" <<STATE
CONTAINERD_PID=${CONTAINERD_PID:-}
KUBELET_PID=${KUBELET_PID:-}
KUBE_PROXY_PID=${KUBE_PROXY_PID:-}
SCHEDULER_PID=${SCHEDULER_PID:-}
FORWARD_PID=${FORWARD_PID:-}
FORWARD_PORTS="${FORWARD_PORTS:-}"
CREATED_RUN_CONTAINERD=${CREATED_RUN_CONTAINERD:-0}
MOUNTED_RUN_NETNS=${MOUNTED_RUN_NETNS:-0}
NODE_NAME=$NODE_NAME
NODE_NETNS=$NODE_NETNS
NODE_IP=$NODE_IP
NODE_HOST_IP=$NODE_HOST_IP
CONTAINERD_ADDRESS=$SOCK
NODE_DIR=$ND
STATE
  if [ -f "$EMU_STATE" ]; then
    # shellcheck disable=SC1090
    (source "$EMU_STATE"
     echo "LEASEHOLD_NODE_KINESIS_ENDPOINT=http://$NODE_HOST_IP:$KINESALITE_PORT"
     echo "LEASEHOLD_NODE_DYNAMODB_ENDPOINT=http://$NODE_HOST_IP:$DYNALITE_PORT"
     [ -z "${KINESIS_MOCK_PORT:-}" ] || echo "LEASEHOLD_NODE_KINESIS_MOCK_ENDPOINT=http://$NODE_HOST_IP:$KINESIS_MOCK_PORT"
    ) >> "$STATE_FILE"
  fi
}

start_forwarder() {
  FORWARD_PORTS="$(wanted_ports)"
  # shellcheck disable=SC2086
  FORWARD_PID="$(spawn forward node "$GROUND_DIR/tcp-forward.js" "$NODE_HOST_IP" $FORWARD_PORTS)"
  local i
  for i in $(seq 1 50); do
    [ "$(grep -c '^forwarding' "$ND/forward.log" 2>/dev/null)" -ge "$(wc -w <<<"$FORWARD_PORTS")" ] && return 0
    pid_alive "$FORWARD_PID" || fail "the forwarder exited"
    sleep 0.1
  done
  fail "the forwarder did not listen on $NODE_HOST_IP"
}

import_images() {
  local archive
  for archive in "$IMAGES_DIR"/*.tar; do
    [ -f "$archive" ] || continue
    ctr_ images import "$archive" >/dev/null 2>>"$ND/import.log" || fail "ctr images import $archive failed"
  done
}

start() {
  [ "$(id -u)" = 0 ] || die "the node needs root (network namespace, cgroups, containerd)"
  load_state 2>/dev/null || true
  if running; then
    # The emulators may have been restarted on other ports since: the forwarder follows them.
    if [ "$FORWARD_PORTS" != "$(wanted_ports)" ]; then
      stop_pid "$FORWARD_PID" node
      start_forwarder
      write_state
      log "forwarder now relays $FORWARD_PORTS"
    fi
    log "node $NODE_NAME already running (netns $NODE_NETNS, $NODE_IP)"
    return 0
  fi
  stop quiet
  install
  for p in ip nsenter unshare openssl ctr containerd runc iptables node; do need "$p" "node.sh install"; done
  [ -f "$CP_STATE" ] || die "the control plane is not running: tests/ground/control-plane.sh start"
  # shellcheck disable=SC1090
  (source "$CP_STATE"; [ "${NODE_SUPPORT:-}" = "$NODE_HOST_IP" ]) ||
    die "the control plane was started without node support (Node authorization, advertised at $NODE_HOST_IP): restart it (tests/ground/control-plane.sh stop; tests/ground/control-plane.sh start)"
  local api_port
  api_port="$(sed -n 's/^APISERVER_PORT=//p' "$CP_STATE")"
  mkdir -p "$ND"
  images_ready
  write_configs "$api_port"
  save_sysctls
  local started=$SECONDS
  CREATED_RUN_CONTAINERD=0
  [ -d /run/containerd ] || CREATED_RUN_CONTAINERD=1
  mkdir -p /run/containerd
  # `ip netns add` turns /run/netns into a mount point the first time; stop undoes that too.
  MOUNTED_RUN_NETNS=0
  mountpoint -q /run/netns || MOUNTED_RUN_NETNS=1
  write_state
  make_network
  make_cgroups

  start_forwarder
  write_state

  # containerd and the kubelet share a mount namespace of their own (a slave of the host's): volume
  # and rootfs mounts, and the pods' network namespaces (/run/netns), never appear on the host and
  # vanish with the last process. /run/containerd (the shims' sockets) is ours in there too.
  CONTAINERD_PID="$(spawn containerd nsenter --net="/run/netns/$NODE_NETNS" -- \
    unshare --mount --propagation slave -- sh -c '
      mount --bind "$1/netns" /run/netns && mount --bind "$1/run-containerd" /run/containerd &&
      exec containerd --config "$1/containerd.toml"' sh "$ND")"
  write_state
  local i
  for i in $(seq 1 100); do
    ctr_ version >/dev/null 2>&1 && break
    pid_alive "$CONTAINERD_PID" || fail "containerd exited during start"
    [ "$i" = 100 ] && fail "containerd did not answer on $SOCK within 20 s"
    sleep 0.2
  done
  import_images
  ctr_ images check "name==$PAUSE_IMAGE" 2>/dev/null | grep -q complete || fail "the pause image is not in containerd"

  KUBELET_PID="$(spawn kubelet nsenter --target "$CONTAINERD_PID" --mount --net -- \
    "$BIN/kubelet" --config "$ND/kubelet.yaml" --kubeconfig "$ND/kubelet.kubeconfig" \
    --root-dir "$ND/kubelet" --cert-dir "$ND/kubelet-pki" --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" --v 1)"
  write_state
  KUBE_PROXY_PID="$(spawn kube-proxy nsenter --net="/run/netns/$NODE_NETNS" -- "$BIN/kube-proxy" --config "$ND/kube-proxy.yaml")"
  write_state
  local sched_port
  sched_port="$(free_port)"
  SCHEDULER_PID="$(spawn kube-scheduler "$BIN/kube-scheduler" --kubeconfig "$ND/kube-scheduler.kubeconfig" \
    --authentication-kubeconfig "$ND/kube-scheduler.kubeconfig" --authorization-kubeconfig "$ND/kube-scheduler.kubeconfig" \
    --leader-elect=false --bind-address 127.0.0.1 --secure-port "$sched_port")"
  write_state

  local deadline=$((SECONDS + READY_TIMEOUT))
  until node_ready; do
    for p in CONTAINERD_PID KUBELET_PID KUBE_PROXY_PID SCHEDULER_PID FORWARD_PID; do
      pid_alive "${!p}" || fail "${p%_PID} exited during start"
    done
    [ $SECONDS -lt $deadline ] || fail "node $NODE_NAME not Ready within $READY_TIMEOUT s"
    sleep 0.5
  done
  # Pods reach the API server through the `kubernetes` Service once kube-proxy has its rules.
  until in_netns iptables -t nat -S KUBE-SERVICES 2>/dev/null | grep -q 'default/kubernetes:https'; do
    pid_alive "$KUBE_PROXY_PID" || fail "kube-proxy exited during start"
    [ $SECONDS -lt $deadline ] || fail "kube-proxy has no rule for the kubernetes Service within $READY_TIMEOUT s"
    sleep 0.5
  done
  log "node $NODE_NAME Ready in $((SECONDS - started)) s (netns $NODE_NETNS, node $NODE_IP, host end $NODE_HOST_IP)"
}

# ---------------------------------------------------------------------------------------------
# images

# The pause image: a few lines of C, linked statically (tests/ground/images.sh builds the others).
images_ready() {
  [ -f "$IMAGES_DIR/pause.tar" ] || "$GROUND_DIR/images.sh" pause >&2 || die "building the pause image failed"
}

# ---------------------------------------------------------------------------------------------
# stop

# Stops one process by PID, but only if it still runs the program named (PIDs can be reused).
stop_pid() { # pid program [timeout-tenths]
  local pid="$1" exe i
  pid_alive "$pid" || return 0
  exe="$(readlink "/proc/$pid/exe" 2>/dev/null || true)"
  [ "$(basename "$exe")" = "$2" ] || return 0
  kill "$pid" 2>/dev/null || true
  for i in $(seq 1 "${3:-100}"); do pid_alive "$pid" || return 0; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
  for i in $(seq 1 20); do pid_alive "$pid" || return 0; sleep 0.1; done
}

# The shims of our containerd (they outlive it): matched by the socket address on their command line.
our_shims() {
  local pid
  for pid in $(ls /proc | grep -E '^[0-9]+$'); do
    case "$(readlink "/proc/$pid/exe" 2>/dev/null)" in */containerd-shim-runc-v2) ;; *) continue ;; esac
    tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "-address $SOCK " && echo "$pid"
  done
}

stop() {
  local quiet="${1:-}"
  load_state 2>/dev/null || true
  stop_pid "${SCHEDULER_PID:-}" kube-scheduler
  # Without the kubelet nothing restarts the containers while they are killed.
  stop_pid "${KUBELET_PID:-}" kubelet
  if pid_alive "${CONTAINERD_PID:-}" && [ -S "$SOCK" ]; then
    local task
    for task in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks kill -s SIGKILL "$task" >/dev/null 2>&1 || true; done
    sleep 0.5
    for task in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks delete -f "$task" >/dev/null 2>&1 || true; done
    for task in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers delete "$task" >/dev/null 2>&1 || true; done
  fi
  stop_pid "${CONTAINERD_PID:-}" containerd
  local pid
  for pid in $(our_shims); do kill -9 "$pid" 2>/dev/null || true; done
  stop_pid "${KUBE_PROXY_PID:-}" kube-proxy
  if [ -e "/run/netns/$NODE_NETNS" ] && [ -x "$BIN/kube-proxy" ]; then
    in_netns "$BIN/kube-proxy" --cleanup >"$ND/kube-proxy-cleanup.log" 2>&1 || true
  fi
  stop_pid "${FORWARD_PID:-}" node
  # The pods bound to this node go with it (the pod garbage collector deletes them).
  if [ -f "$CP_STATE" ] && [ -x "$BIN/kubectl" ]; then
    kubectl_ delete node "$NODE_NAME" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  fi
  # The namespace takes the veth pair (both ends), the bridge, the pods' veths and every iptables rule.
  if ip netns list 2>/dev/null | grep -qw "^$NODE_NETNS"; then ip netns delete "$NODE_NETNS" || true; fi
  if ip link show "$NODE_HOST_IF" >/dev/null 2>&1; then ip link delete "$NODE_HOST_IF" || true; fi
  if [ "${MOUNTED_RUN_NETNS:-0}" = 1 ] && mountpoint -q /run/netns && [ -z "$(ls -A /run/netns)" ]; then
    umount /run/netns || true
  fi
  # Mounts: all were made in the private mount namespace, gone with its last process; anything under
  # our directory still mounted on the host (there should be none) is unmounted, deepest first.
  local m
  for m in $(awk -v d="$ND/" 'index($2, d) == 1 {print $2}' /proc/self/mounts | sort -r); do umount -l "$m" || true; done
  remove_cgroups
  if [ -f "$ND/sysctls.saved" ]; then
    local line
    while IFS= read -r line; do sysctl -qw "$line" || true; done < "$ND/sysctls.saved"
    rm -f "$ND/sysctls.saved"
  fi
  if [ "${CREATED_RUN_CONTAINERD:-0}" = 1 ] && [ -d /run/containerd ]; then
    find /run/containerd -depth -type d -empty -delete 2>/dev/null || true
  fi
  rm -f "$STATE_FILE"
  [ "$quiet" = quiet ] || log "node stopped; the machine is as it was (sysctls, cgroups, interfaces, netns)"
}

remove_cgroups() {
  local h dir
  for h in /sys/fs/cgroup/*/; do
    dir="${h%/}$CGROUP_ROOT"
    [ -d "$dir" ] || continue
    # Deepest first; a cgroup still holding a process stays (and is reported).
    find "$dir" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    [ -d "$dir" ] && log "warning: $dir still exists (processes left in it: $(cat "$dir"/cgroup.procs 2>/dev/null | wc -l))"
  done
  return 0
}

status() {
  if running; then cat "$STATE_FILE"; return 0; fi
  echo "node not running" >&2
  return 1
}

# One start or stop at a time.
lock() {
  need flock "apt-get install util-linux"
  exec 9>"$LEASEHOLD_STATE/node.lock"
  flock -w 900 9 || die "another node.sh holds $LEASEHOLD_STATE/node.lock"
}

case "${1:-}" in
  install) lock; install ;;
  start) lock; start ;;
  stop) lock; stop ;;
  status) status ;;
  env) running || die "node not running: run tests/ground/node.sh start"
       grep -E '^(NODE_|CONTAINERD_ADDRESS|LEASEHOLD_NODE_)' "$STATE_FILE" | sed 's/^/export /' ;;
  *) echo "usage: $0 install|start|stop|status|env" >&2; exit 2 ;;
esac
