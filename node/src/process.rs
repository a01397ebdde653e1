//! `skiff node` as one process, as k3s's agent composes it: the built-in
//! images written, a private containerd started and supervised (unless
//! `--container-runtime-endpoint` names one), image archives imported,
//! a blackhole route for the cluster range and a route for the service
//! range into a sink that drops it (so the host reaches cluster IPs), the CNI config
//! once the pod CIDR is known, then the agent (with routes to other
//! hosts' pod CIDRs, the service proxy and cluster DNS). On the way out
//! containerd is stopped; containers, routes and service rules stay for
//! the next start to adopt, unless `remove_pods_on_exit` asks for
//! everything to go.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use skiff_shutdown::Shutdown;

use crate::agent::{self, NodeNetwork};
use crate::cni::{self, CniConfig};
use crate::config::NodeConfig;
use crate::containerd::{self, Containerd, ContainerdConfig};
use crate::images::{self, ImageImporter};
use crate::routes;
use crate::runtime::cri::{self, CriRuntime};
use crate::runtime::Runtime;

/// What `skiff node` takes beyond the agent's own settings.
#[derive(Debug, Clone)]
pub struct ProcessOptions {
    /// The agent's settings.
    pub node: NodeConfig,
    /// An existing CRI endpoint; `None` runs a private containerd.
    pub runtime_endpoint: Option<String>,
    /// The containerd binary for the private one.
    pub containerd_binary: PathBuf,
    /// Image archives imported at start and when added (default `<data>/images`).
    pub images_dir: Option<PathBuf>,
    /// Where the CNI conflist goes with an existing runtime (its CRI
    /// plugin's `conf_dir`); a private containerd has its own.
    pub cni_conf_dir: PathBuf,
    /// Stop and remove every container of this node on the way out.
    pub remove_pods_on_exit: bool,
}

impl ProcessOptions {
    /// A private containerd, images in `<data>/images`.
    pub fn new(node: NodeConfig) -> ProcessOptions {
        ProcessOptions {
            node,
            runtime_endpoint: None,
            containerd_binary: PathBuf::from("containerd"),
            images_dir: None,
            cni_conf_dir: PathBuf::from("/etc/cni/net.d"),
            remove_pods_on_exit: false,
        }
    }
}

/// Why the node process could not start or ran into trouble.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// A directory could not be made.
    #[error("{0}")]
    Io(String),
    /// The private containerd did not start.
    #[error(transparent)]
    Containerd(#[from] containerd::ContainerdError),
    /// The runtime endpoint does not answer.
    #[error("{0}")]
    Runtime(#[from] crate::runtime::RuntimeError),
    /// The built-in images could not be written.
    #[error("built-in images: {0}")]
    Images(String),
    /// The agent stopped with an error.
    #[error(transparent)]
    Agent(#[from] agent::RunError),
    /// The node could not join with its token.
    #[error("joining the cluster: {0}")]
    Join(#[from] skiff_client::join::JoinError),
}

/// The node's pod network: its CNI conflist for the pod CIDR.
struct CniNetwork {
    node: String,
    conf_dir: PathBuf,
    ipam_dir: PathBuf,
}

impl NodeNetwork for CniNetwork {
    fn configure(&self, pod_cidr: &str) -> Result<(), String> {
        let config = CniConfig {
            node_name: self.node.clone(),
            pod_cidr: pod_cidr.to_string(),
            ipam_data_dir: self.ipam_dir.clone(),
        };
        config.write(&self.conf_dir).map(|_| ()).map_err(|e| e.to_string())
    }

    fn routes_to_other_hosts(&self) -> bool {
        true
    }
}

fn mkdir(path: &Path) -> Result<(), ProcessError> {
    std::fs::create_dir_all(path).map_err(|e| ProcessError::Io(format!("creating {}: {e}", path.display())))
}

/// Runs `skiff node` until `shutdown`.
pub async fn run(mut options: ProcessOptions, shutdown: Shutdown) -> Result<(), ProcessError> {
    let data = options.node.data_dir.clone();
    mkdir(&data)?;
    // A node that joins with a token, or joined with one before, connects
    // with its own certificate: settled before anything else starts, so a
    // token that does not pin this cluster's CA stops the node at once.
    let kept = skiff_client::join::NodeFiles::new(&data.join("pki"));
    if options.node.join_token.is_some() || (options.node.tls.is_none() && kept.client_files().ca.exists()) {
        let node = &options.node;
        let files =
            skiff_client::join::node_credentials(&node.servers, node.join_token.as_ref(), &node.name, &kept).await?;
        options.node.tls = Some(files);
    }
    let images_dir = options.images_dir.clone().unwrap_or_else(|| data.join("images"));
    mkdir(&images_dir)?;
    images::write_builtin_images(&images_dir).map_err(|e| ProcessError::Images(e.to_string()))?;

    // containerd outlives the agent's own shutdown so pods can be removed first.
    let runtime_shutdown = Shutdown::new();
    let (containerd, endpoint, conf_dir) = match &options.runtime_endpoint {
        Some(endpoint) => (None, endpoint.clone(), options.cni_conf_dir.clone()),
        None => {
            let mut config = ContainerdConfig::new(&data.join("containerd"));
            config.binary = options.containerd_binary.clone();
            let conf_dir = config.cni_conf_dir.clone();
            let containerd = Containerd::start(config, &runtime_shutdown).await?;
            let endpoint = containerd.endpoint();
            (Some(containerd), endpoint, conf_dir)
        }
    };
    let outcome = serve(&options, &endpoint, &images_dir, conf_dir, shutdown).await;
    if let Some(containerd) = containerd {
        containerd.stop().await;
        if options.remove_pods_on_exit {
            let killed = containerd::kill_shims(&containerd.socket());
            if killed > 0 {
                tracing::warn!(killed, "killed container processes the runtime had not removed");
            }
        }
    }
    runtime_shutdown.stop().await;
    outcome
}

async fn serve(
    options: &ProcessOptions,
    endpoint: &str,
    images_dir: &Path,
    conf_dir: PathBuf,
    shutdown: Shutdown,
) -> Result<(), ProcessError> {
    let runtime: Arc<dyn Runtime> = Arc::new(CriRuntime::connect(endpoint).await?);
    let socket = cri::socket_path(endpoint)?;
    let mut importer = ImageImporter::new(images_dir, Path::new("ctr"), &socket);
    if let Err(e) = importer.scan().await {
        tracing::warn!(error = %e, "importing image archives");
    }
    let importer_shutdown = shutdown.child();
    importer.spawn(images::IMPORT_INTERVAL, &importer_shutdown);
    if let Err(e) = cni::add_blackhole_routes(&[cni::CLUSTER_CIDR]).await {
        tracing::warn!(error = %e, "blackhole route for the cluster range");
    }
    if let Err(e) = cni::add_service_sink(cni::SERVICE_CIDR).await {
        tracing::warn!(error = %e, "the service range's sink");
    }
    let name = options.node.name.clone();
    let network =
        Arc::new(CniNetwork { node: name.clone(), conf_dir, ipam_dir: options.node.data_dir.join("cni").join("ipam") });
    let outcome = agent::run(options.node.clone(), runtime.clone(), network, shutdown.child()).await;
    shutdown.cancel();
    importer_shutdown.stop().await;
    if options.remove_pods_on_exit {
        match containerd::teardown(runtime.as_ref(), &name).await {
            Ok(n) => tracing::info!(sandboxes = n, "removed this node's pods on exit"),
            Err(e) => tracing::warn!(error = %e, "removing this node's pods on exit"),
        }
        if let Err(e) = cni::delete_bridge(&cni::bridge_name(&name)).await {
            tracing::warn!(error = %e, "deleting the node's bridge");
        }
        if options.node.proxy.is_some() {
            match crate::proxy::cleanup(Some(&crate::proxy::rules::tag(&name))).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(chains = n, "removed this node's service rules on exit"),
                Err(e) => tracing::warn!(error = %e, "removing this node's service rules"),
            }
        }
        // Another agent on this host puts back what it still needs at its
        // next resync.
        match routes::remove_all().await {
            Ok(0) => {}
            Ok(n) => tracing::info!(routes = n, "removed the routes to other hosts' pods on exit"),
            Err(e) => tracing::warn!(error = %e, "removing the routes to other hosts' pods"),
        }
    }
    Ok(outcome?)
}
