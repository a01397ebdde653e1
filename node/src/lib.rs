//! Skiff's node agent: joins a worker to the cluster and runs the pods
//! bound to it in real containers, as the seed's kubelet does, through the
//! Container Runtime Interface (containerd, runc and CNI underneath).
//!
//! # Layout
//! - [`config`]: what `skiff node` takes.
//! - [`host`]: the host's CPUs, memory, disk and pids, and nodeInfo facts.
//! - [`node_status`]: the Node as registered, capacity and allocatable, conditions.
//! - [`heartbeat`]: registration, the node Lease, the NodeStatus loop.
//! - [`static_pods`]: pods from `--manifest-dir` and `--manifest-url`, and their mirrors.
//! - [`logs`]: CRI log lines and `kubectl logs`' selection (tail, since, timestamps).
//! - [`server`]: the agent's HTTP API: container logs, exec, `/stats/summary`, `/metrics`.
//! - [`stats`]: CPU usage rates sampled every housekeeping interval.
//! - [`runtime`]: the `Runtime` trait, CRI-shaped, in Skiff's own types;
//!   `runtime::fake` is an in-memory runtime for tests with paused time;
//!   `runtime::cri` is the real one, a CRI v1 client over a unix socket.
//! - [`containerd`]: runs and supervises a private containerd per node (its
//!   own config, root, state and sockets under the node's data dir).
//! - [`images`]: OCI image archives written in Rust (busybox-based images
//!   and the pause image) and the import of `*.tar` archives into
//!   containerd, so pods run without a registry.
//! - [`cni`]: the node's CNI config (bridge, host-local, portmap) and the
//!   host routes and links around it.
//! - [`routes`]: routes to the other hosts' nodes' pod CIDRs (host-gw).
//! - [`dns`]: the cluster DNS server the node's pods use, at their bridge's
//!   gateway: Services and EndpointSlices as records, other names forwarded.
//! - [`proxy`]: the service proxy: Services' cluster IPs and NodePorts as
//!   iptables NAT rules to their ready endpoints (kube-proxy's iptables mode).
//! - [`pod`]: the pod workers: one task per pod syncing its spec to the
//!   runtime (sandbox, images, init/sidecar/main containers, probes,
//!   hooks, restarts, termination) and reporting status and events.
//! - [`pod_objects`]: the Secrets and ConfigMaps pods reference, read one
//!   by one, and their service account tokens.
//! - [`agent`]: `run`: registration, heartbeats, pod sources, the workers,
//!   and what they report written back to the apiserver.
//! - [`process`]: `skiff node` as one process: containerd, images, CNI, the agent.
//! - [`metrics`]: the agent's metrics.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod agent;
pub mod cni;
pub mod config;
pub mod containerd;
pub mod dns;
pub mod heartbeat;
pub mod host;
pub mod images;
pub mod logs;
pub mod metrics;
pub mod node_status;
pub mod pod;
pub mod pod_objects;
pub mod process;
pub mod proxy;
pub mod pty;
pub mod routes;
pub mod runtime;
pub mod server;
pub mod static_pods;
pub mod stats;
