# Leasehold: `make demo` shows it working, `make test` runs every test. See README.md.
SHELL := /bin/bash
export LEASEHOLD_CACHE ?= $(HOME)/.cache/leasehold
export CARGO_TARGET_DIR ?= $(LEASEHOLD_CACHE)/target
export CARGO_TERM_COLOR ?= never
GROUND := tests/ground

.PHONY: release-cli push-images fuzz fuzz-smoke moto moto-stop moto-kcl moto-kcl-stop prometheus plots cli kcl-java test-kcl-import check-binaries chaos soak-chaos faketime crds reference demo-local demo-workers test test-node lint soak emulators emulators-stop control-plane control-plane-stop node node-stop images test-images bench bench-kcl demo fmt

## Everything CI runs: emulators, control plane, the real node with the project's images, formatting and
## lints, all tests (the real-pod tests included, and the import from the real Java KCL).
test: emulators moto moto-kcl control-plane faketime prometheus kcl-java lint fuzz-smoke test-images node
	$(GROUND)/images.sh check
	cargo test --locked --workspace --no-fail-fast --features leasehold-operator/real-node

## Formatting, clippy, and cargo-deny on licences, bans and sources (deny.toml; offline).
lint:
	cargo fmt --all -- --check
	cargo clippy --locked --workspace --all-targets -- -D warnings
	$(GROUND)/deny.sh check

## The parsers' fuzz targets (fuzz/, libFuzzer on the nightly toolchain; cargo-fuzz installed when
## missing), each for FUZZ_SECONDS (default 600), two at a time; inputs that add coverage join
## fuzz/corpus/<target>. docs/testing.md, "Fuzzing".
fuzz:
	FUZZ_SECONDS=$${FUZZ_SECONDS:-600} $(GROUND)/fuzz.sh run

## What `make test` runs of them: every committed input (fuzz/corpus, fuzz/regressions) once, then
## FUZZ_SMOKE_SECONDS (default 20) of new inputs per target; any crash, timeout or OOM fails it.
fuzz-smoke:
	$(GROUND)/fuzz.sh smoke

emulators:
	$(GROUND)/emulators.sh start

## moto's server mode (PyPI, in a venv in the cache) on loopback: SQS and S3 for the dead-letter
## destinations' tests (worker/tests/destinations.rs). Never used for lease tables.
moto:
	$(GROUND)/moto.sh start

moto-stop:
	$(GROUND)/moto.sh stop

## A second, separate moto on its own loopback port, only for the Java KCL 3.x's tables (its lease table
## has a GSI dynalite refuses): the KCL 3.x import test and `make bench-kcl`'s java3 column.
moto-kcl:
	$(GROUND)/moto-kcl.sh start

moto-kcl-stop:
	$(GROUND)/moto-kcl.sh stop

## Prometheus and promtool (Debian's package, unpacked into the cache) and the Prometheus Operator's CRDs
## (its Go module): the chart's alert unit tests, the live scrape check and the CRD validation.
prometheus:
	$(GROUND)/prometheus.sh install >/dev/null
	$(GROUND)/prometheus.sh crds >/dev/null

## The plots of docs/benchmarks.md and docs/operations.md: docs/plots/plot.py (matplotlib in a venv in the
## cache) draws docs/plots/*.png from docs/plots/data/.
plots:
	$(GROUND)/plots.sh run

## libfaketime (Debian's, unpacked into the cache) for the chaos suite's clock skew.
faketime:
	$(GROUND)/faketime.sh install >/dev/null

## The chaos suite alone, seeded: LEASEHOLD_CHAOS_SEED=<seed> replays a round, LEASEHOLD_CHAOS_ROUNDS=<n>
## and LEASEHOLD_CHAOS_SECONDS=<s> (per round) size the run; docs/testing.md, "The chaos suite".
chaos: emulators faketime
	cargo test --locked -p leasehold-worker --test chaos -- --nocapture

## The chaos suite as a soak: one round of the whole nemesis mix (LEASEHOLD_CHAOS_SECONDS, default
## 30 minutes) at 1 record/s per shard, every worker's RSS and fds sampled, two long-lived stayers'
## growth bounded, and the checker's rules; docs/testing.md, "Soak of the chaos mix".
soak-chaos: emulators faketime
	LEASEHOLD_CHAOS_SOAK=1 LEASEHOLD_CHAOS_SECONDS=$${LEASEHOLD_CHAOS_SECONDS:-1800} \
	  cargo test --locked -p leasehold-worker --test chaos -- --nocapture seeded_nemesis_rounds_break_no_rule

emulators-stop:
	$(GROUND)/emulators.sh stop

## A local Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager) on loopback.
control-plane:
	$(GROUND)/control-plane.sh start

control-plane-stop:
	$(GROUND)/control-plane.sh stop

## A real node (containerd, runc, kubelet, kube-proxy, kube-scheduler) in a network namespace of its own,
## joined to the control plane, with the images of `make images` loaded.
node: emulators control-plane
	$(GROUND)/node.sh start
	$(GROUND)/images.sh import

node-stop:
	$(GROUND)/node.sh stop

## The worker, operator and pause images as OCI archives (no container daemon) in $(LEASEHOLD_CACHE)/images,
## from static release binaries; loaded into the node when it runs.
images:
	$(GROUND)/images.sh build
	if $(GROUND)/node.sh status >/dev/null 2>&1; then $(GROUND)/images.sh import; fi

## The same images from unoptimized static binaries (profile `test-image`): what `make test` runs on the
## node, quick to build on a cold machine.
test-images:
	LEASEHOLD_IMAGE_PROFILE=test-image $(GROUND)/images.sh build
	if $(GROUND)/node.sh status >/dev/null 2>&1; then $(GROUND)/images.sh import; fi

## Benchmarks (release build) against the emulators; prints markdown for docs/benchmarks.md.
bench: emulators control-plane
	cargo bench --locked -p leasehold-worker --bench lease_store
	cargo bench --locked -p leasehold-worker --bench runtime
	cargo bench --locked -p leasehold-worker --bench processors
	cargo bench --locked -p leasehold-worker --bench dispatch
	cargo bench --locked -p leasehold-worker --bench scale
	cargo bench --locked -p leasehold-worker --bench spread
	cargo bench --locked -p leasehold-operator --bench consumers
	cargo bench --locked -p leasehold-operator --bench lag
	$(MAKE) bench-kcl

## 30 minutes of churn (kill -9, SIGTERM, restarts), DynamoDB throttling and resharding at 1 record/s
## per shard; memory and file descriptors of the workers that stay up must stay bounded.
soak: emulators
	LEASEHOLD_SOAK_SECS=$${LEASEHOLD_SOAK_SECS:-1800} cargo test --locked -p leasehold-worker --test soak -- --nocapture

## The tests on a real node (kubelet + containerd in a network namespace) with the project's own images:
## worker pods and the chart's operator pods run for real; the same tests `make test` runs among the others.
test-node: emulators control-plane test-images node
	$(GROUND)/images.sh check
	cargo test --locked -p leasehold-operator --features real-node --test node_e2e --test node_chart --test node_scaling

## The Java KCL MultiLangDaemon and the worker side by side (same amazon_kclpy sample): throughput,
## CPU and memory on the same backlog (2 rounds, each run on a kinesalite of its own, beside the emulator's
## own ceiling), then failover after kill -9 (3 trials each); then the KCL 3.x
## (java3, its tables on moto-kcl) beside them, and SIGTERM handoff and a worker joining, under a trickle of
## 20 records/s (the KCL 3.x never moves a lease of an idle stream); then the hot-shard spread (4 consumers,
## 8 shards, 2 hot, a fixed cost per record on each consumer's CPU; the worker with lease.balance: load).
bench-kcl: emulators moto-kcl
	$(GROUND)/kcl-bench.sh all --records 100000 --rounds 2 --emulator-ceiling
	$(GROUND)/kcl-bench.sh both --failover 3 --timeout 400
	$(GROUND)/kcl-bench.sh java3,worker,worker-batched --records 100000
	$(GROUND)/kcl-bench.sh java3 --failover 3 --timeout 400 --trickle 20
	$(GROUND)/kcl-bench.sh java,java3,worker --handoff 3 --timeout 400 --trickle 20
	$(GROUND)/kcl-bench.sh java,java3,worker --join 3 --timeout 400 --trickle 20
	$(GROUND)/kcl-bench.sh java,java3,worker --spread 1 --watch 300 --timeout 400

## The whole loop, narrated, on a real node: control plane, emulators, the node with the project's images,
## the operator; apply a consumer, records through real worker pods, delete a pod and kill a container and
## watch their shards move, delete, clean up.
demo: emulators control-plane test-images node
	cargo build --locked -q -p leasehold-operator --bin leasehold-operator --example node_demo
	LEASEHOLD_OPERATOR_BIN=$(CARGO_TARGET_DIR)/debug/leasehold-operator $(CARGO_TARGET_DIR)/debug/examples/node_demo

## The same loop without a node (no root needed): worker pods run as processes by a stand-in kubelet.
demo-local: emulators control-plane
	cargo build --locked -q -p leasehold-worker --bin leasehold-worker
	cargo build --locked -q -p leasehold-operator --bin leasehold-operator --example demo
	LEASEHOLD_OPERATOR_BIN=$(CARGO_TARGET_DIR)/debug/leasehold-operator $(CARGO_TARGET_DIR)/debug/examples/demo

## The workers alone (no Kubernetes): three processes share a stream; one killed, one shut down.
demo-workers: emulators
	cargo build --locked -q -p leasehold-worker --bin leasehold-worker --example workers_demo
	LEASEHOLD_WORKER_BIN=$(CARGO_TARGET_DIR)/debug/leasehold-worker $(CARGO_TARGET_DIR)/debug/examples/workers_demo

## The `leasehold` CLI and its kubectl plugin `kubectl-leasehold` (release build); copy both onto PATH
## (`kubectl leasehold ...`), or through krew with the manifest `make release-cli` writes.
cli:
	cargo build --locked --release -p leasehold-cli --bin leasehold --bin kubectl-leasehold
	@echo "built $(CARGO_TARGET_DIR)/release/leasehold and $(CARGO_TARGET_DIR)/release/kubectl-leasehold"

## The kubectl plugin's release archive and its krew manifest with the archive's sha256 (release build),
## in $(CARGO_TARGET_DIR)/krew; KREW_BASE_URL is where you will upload the archive. Nothing is published.
release-cli:
	cli/krew/release.sh --base-url "$${KREW_BASE_URL:?set KREW_BASE_URL to where the archive will be served}"

## Push the images of `make images` to a registry of yours: `make push-images REGISTRY=ghcr.io/you`
## (images/push.sh; DRY_RUN=1 prints the commands only).
push-images:
	images/push.sh $${DRY_RUN:+--dry-run} "$${REGISTRY:?set REGISTRY, e.g. ghcr.io/you}"

## A JDK and Maven (Debian's packages, when missing) and the Java KCL's jars (Maven Central, into the cache):
## 2.5.4 and 3.1.3.
kcl-java:
	$(GROUND)/kcl-java.sh install >/dev/null
	KCL_VERSION=3.1.3 $(GROUND)/kcl-java.sh install >/dev/null

## `leasehold import-kcl` against a lease table written by the real Java KCL 2.5.4 MultiLangDaemon: KCL
## killed mid-stream with a checkpoint inside a KPL aggregate, import, then a worker processes every record
## after the KCL's checkpoints and none before them; then the same from the KCL 3.x (3.1.3, its tables on
## moto-kcl). Alone; `make test` runs them as cli/tests/import_kcl_java.rs and cli/tests/import_kcl3_java.rs.
test-kcl-import: emulators moto-kcl kcl-java
	$(GROUND)/kcl-import.sh
	KCL_VERSION=3.1.3 $(GROUND)/kcl-import.sh

## Regenerate the CRD YAML from the Rust types and the spec/status reference (a test fails when the
## committed copies drift).
crds:
	cargo run --locked -q -p leasehold-crds --bin crdgen > crds/streamconsumer.yaml
	cp crds/streamconsumer.yaml charts/leasehold/crds/streamconsumer.yaml
	mkdir -p docs/reference
	cargo run --locked -q -p leasehold-crds --bin crdgen -- --reference > docs/reference/spec.md

## Regenerate every generated reference page of docs/reference/ (the CRD with them): spec and status,
## the worker's, operator's and CLI's flags and exit codes, the worker's and operator's metrics. Each
## page's `reference_page_*` test rewrites it when LEASEHOLD_WRITE_REFERENCE is set, and fails on drift
## otherwise (docs/testing.md, "Generated references").
reference: crds
	LEASEHOLD_WRITE_REFERENCE=1 cargo test --locked -q -p leasehold-worker --lib -- reference_page
	LEASEHOLD_WRITE_REFERENCE=1 cargo test --locked -q -p leasehold-operator --lib --bin leasehold-operator -- reference_page
	LEASEHOLD_WRITE_REFERENCE=1 cargo test --locked -q -p leasehold-cli --lib -- reference_page

## Release binaries linked statically, with their sizes (what can be checked of the images here).
check-binaries:
	tests/ground/check-binaries.sh

fmt:
	cargo fmt --all
