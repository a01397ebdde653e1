# Skiff: `make up` starts a local 3-master cluster, `make test` runs the tests.
# Both first install what a fresh Debian machine lacks (see `deps`).

# One optimised build, kept outside the clone so CI and later runs reuse it.
CARGO_TARGET_DIR ?= $(HOME)/.cache/skiff/target
export CARGO_TARGET_DIR
BIN := $(CARGO_TARGET_DIR)/release
CARGO ?= cargo
SHELL := /bin/bash

.PHONY: deps build up test chaos lint fmt clean-up bench bench-deps bench-objects bench-controllers bench-scheduler bench-node bench-proxy

# libclang-dev: bindgen for RocksDB's bindings; lld: LLVM's linker, whose
# identical code folding keeps `skiff` under 50 MB (build.rs); etcd-client: etcdctl for the
# compatibility tests; iproute2: network namespaces for the chaos suite
# and partition tests; curl: requests from inside a partitioned namespace;
# containerd, runc, containernetworking-plugins, iptables: the node agent's
# private containerd, its containers and pod network (CNI's bridge,
# host-local, portmap, loopback); conntrack: the service proxy clears UDP
# flows to endpoints that went; nftables: the proxy's nftables mode (`nft`);
# busybox-static: the built-in images.
# Installed only when missing.
deps:
	@missing=""; \
	dpkg -s libclang-dev >/dev/null 2>&1 || missing="$$missing libclang-dev"; \
	command -v etcdctl >/dev/null 2>&1 || missing="$$missing etcd-client"; \
	command -v g++ >/dev/null 2>&1 || missing="$$missing g++"; \
	command -v ld.lld >/dev/null 2>&1 || missing="$$missing lld"; \
	command -v ip >/dev/null 2>&1 || missing="$$missing iproute2"; \
	command -v curl >/dev/null 2>&1 || missing="$$missing curl"; \
	command -v containerd >/dev/null 2>&1 || missing="$$missing containerd"; \
	command -v runc >/dev/null 2>&1 || missing="$$missing runc"; \
	[ -x /usr/lib/cni/bridge ] || missing="$$missing containernetworking-plugins"; \
	command -v iptables >/dev/null 2>&1 || missing="$$missing iptables"; \
	command -v conntrack >/dev/null 2>&1 || missing="$$missing conntrack"; \
	command -v nft >/dev/null 2>&1 || missing="$$missing nftables"; \
	dpkg -s busybox-static >/dev/null 2>&1 || missing="$$missing busybox-static"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi
	@# The official Python Kubernetes client, for the client-compatibility test.
	@python3 -c 'import kubernetes' 2>/dev/null || { echo "installing: kubernetes (PyPI)"; \
		python3 -m pip --version >/dev/null 2>&1 || { SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
			$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq python3-pip; }; \
		python3 -m pip install --quiet --disable-pip-version-check kubernetes 2>/dev/null || \
		python3 -m pip install --quiet --disable-pip-version-check --break-system-packages kubernetes; }
	@command -v kubectl >/dev/null 2>&1 || echo "warning: kubectl is not installed; the kubectl tests will fail"

build: deps
	$(CARGO) build --release --workspace --bins

# A 3-master cluster on 127.0.0.1 (client ports 2379/2389/2399) with 2 worker
# nodes (each its own containerd; needs root), foreground; Ctrl-C stops it.
up: build
	$(BIN)/skiff up --masters 3 --dir .skiff/up

# Ends with one "N passed, M failed" line summed over every test binary.
test: deps
	$(CARGO) build --release --workspace --bins
	@set -o pipefail; log=$$(mktemp); \
	$(CARGO) test --release --workspace --no-fail-fast -- --test-threads 2 2>&1 | tee $$log; status=$$?; \
	grep -E '^test result:' $$log | awk '{p+=$$4; f+=$$6} END {printf "\n%d passed, %d failed\n", p, f}'; \
	rm -f $$log; exit $$status

# The long chaos run (default 10 minutes, 100+ faults; SKIFF_CHAOS_DURATION
# seconds, SKIFF_CHAOS_SEED to replay, SKIFF_CHAOS_MASTERS=5), and the
# leader-kill test with 10 kills. `make test` runs a one-minute chaos run.
CHAOS_SECONDS ?= 600
chaos: deps
	$(CARGO) build --release --workspace --bins
	SKIFF_CHAOS_DURATION=$(CHAOS_SECONDS) SKIFF_CHAOS_REPORT=$${SKIFF_CHAOS_REPORT:-chaos-report.json} \
		$(CARGO) test --release --test chaos -- --nocapture --test-threads 1
	SKIFF_CHAOS_KILLS=10 $(CARGO) test --release --test cluster leader_kills -- --test-threads 1

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --release --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

clean-up:
	rm -rf .skiff/up

# Skiff against etcd, side by side (bench/README.md). bench/ is a workspace of
# its own, so `make test` never needs protoc: etcd-client's build script does.
# protobuf-compiler: protoc; etcd-server: the etcd 3.4 it is compared with.
bench-deps:
	@missing=""; \
	command -v protoc >/dev/null 2>&1 || missing="$$missing protobuf-compiler"; \
	command -v etcd >/dev/null 2>&1 || missing="$$missing etcd-server"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

# Starts a 3-member Skiff, then a 3-member etcd, on 127.0.0.1; prints the table
# and writes it into bench/README.md. BENCH_ARGS passes flags to `skiff-bench suite`.
bench: deps bench-deps
	$(CARGO) build --release --workspace --bins
	$(CARGO) build --release --manifest-path bench/Cargo.toml
	$(BIN)/skiff-bench suite --skiff $(BIN)/skiff --etcd "$$(command -v etcd)" \
		--readme bench/README.md --command-line "make bench $(BENCH_ARGS)" $(BENCH_ARGS)

# Skiff's own resource API on a fresh 3-member Skiff: pod creates, LISTs from a
# follower, memory and disk per pod, pod watch fan-out (bench/README.md). Writes
# its own section of bench/README.md. BENCH_OBJECTS_ARGS passes flags to
# `skiff-bench objects`. bench-deps: the harness is one binary with `bench`.
bench-objects: deps bench-deps
	$(CARGO) build --release --workspace --bins
	$(CARGO) build --release --manifest-path bench/Cargo.toml
	$(BIN)/skiff-bench objects --skiff $(BIN)/skiff \
		--readme bench/README.md --command-line "make bench-objects $(BENCH_OBJECTS_ARGS)" $(BENCH_OBJECTS_ARGS)

# The controller manager on a fresh 3-member Skiff, with the harness standing
# in for the scheduler and kubelets: a 1,000-replica Deployment, its rolling
# update, a Job of 10,000 completions, deleting a namespace of 10,000 objects,
# controller-manager failover (issue 21). Writes its own section of
# bench/README.md. BENCH_CONTROLLERS_ARGS passes flags to `skiff-bench controllers`
# (e.g. --replicas 100 --completions 500 --objects 1000 for a quick run).
bench-controllers: deps bench-deps
	$(CARGO) build --release --workspace --bins
	$(CARGO) build --release --manifest-path bench/Cargo.toml
	$(BIN)/skiff-bench controllers --skiff $(BIN)/skiff \
		--readme bench/README.md --command-line "make bench-controllers $(BENCH_CONTROLLERS_ARGS)" $(BENCH_CONTROLLERS_ARGS)

# The scheduler on 5,000 hollow nodes (kwok-style: Node objects renewing their
# Leases, pods marked Running once bound) in the manner of scheduler_perf:
# basic pods, required anti-affinity, pod affinity, topology spread,
# preemption, then a fill to 50,000 pods for the scheduler's memory (issue 22).
# A fresh 3-member Skiff without a scheduler and one `skiff scheduler` process
# of its own. Writes its own section of bench/README.md. BENCH_SCHEDULER_ARGS
# passes flags to `skiff-bench scheduler` (e.g. --nodes 500 --pods 1000
# --skip-fill for a quick run; --stand-in to test the harness without a scheduler).
bench-scheduler: deps bench-deps
	$(CARGO) build --release --workspace --bins
	$(CARGO) build --release --manifest-path bench/Cargo.toml
	$(BIN)/skiff-bench scheduler --skiff $(BIN)/skiff \
		--readme bench/README.md --command-line "make bench-scheduler $(BENCH_SCHEDULER_ARGS)" $(BENCH_SCHEDULER_ARGS)

# Node agents with real containers (issue 23): a fresh 3-member Skiff, one
# `skiff scheduler`, 2 `skiff node`s (each its own containerd, runc and CNI
# bridge; pod CIDRs 10.244.231.0/24 and 10.244.232.0/24): pod startup latency
# (create to Running seen by a watch) for 1 pod, 10 times, and for 100 pods at
# once; each agent's CPU and RSS idle, during the burst and with the 100 pods
# running; containerd's, the shims' and the containers'. Needs root (`deps`
# installs containerd, runc and the CNI plugins). Writes its own section of
# bench/README.md. BENCH_NODE_ARGS passes flags to `skiff-bench node` (e.g.
# --pods 20 --single-runs 3 for a quick run, --bind-directly without a scheduler).
bench-node: deps bench-deps
	$(CARGO) build --release --workspace --bins
	$(CARGO) build --release --manifest-path bench/Cargo.toml
	$(BIN)/skiff-bench node --skiff $(BIN)/skiff \
		--readme bench/README.md --command-line "make bench-node $(BENCH_NODE_ARGS)" $(BENCH_NODE_ARGS)

# The service proxy and the cluster DNS, in a network namespace the run makes
# and deletes (no rule or packet touches the host's): full and incremental
# iptables syncs for 1,000 Services x 10 endpoints, DNS queries/s and latency
# for their names, and endpoint ready -> first connection through the cluster
# IP with a 1-member Skiff and `skiff proxy`. Needs root and iptables. Writes
# its own section of bench/README.md. BENCH_PROXY_ARGS passes flags to
# `skiff-bench proxy` (e.g. --ready-runs 5 --dns-duration 3s for a quick run).
bench-proxy: deps bench-deps
	$(CARGO) build --release --workspace --bins
	$(CARGO) build --release --manifest-path bench/Cargo.toml
	$(BIN)/skiff-bench proxy --skiff $(BIN)/skiff \
		--readme bench/README.md --command-line "make bench-proxy $(BENCH_PROXY_ARGS)" $(BENCH_PROXY_ARGS)
