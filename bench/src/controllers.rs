//! `skiff-bench controllers`: the controller manager's speed, for issue 21.
//! A fresh 3-member cluster on loopback, two `skiff controller-manager`
//! processes (one holds the Lease `kube-system/kube-controller-manager`, the
//! other stands by), and a stand-in for the scheduler and the kubelets: a
//! task in this harness that watches every pod and, for each new one, binds
//! it to one of a few fake Nodes and sets its status to Running and Ready
//! (pods labelled `job-name` to Succeeded instead); pods being deleted it
//! deletes at once (grace 0). Measured in this order, wall clock:
//!
//! 1. **Deployment.** `replicas` replicas (maxSurge and maxUnavailable 25%):
//!    creation to every pod created (as the stand-in sees them), and to
//!    status.availableReplicas == updatedReplicas == replicas.
//! 2. **Rolling update.** A new image: to observedGeneration >= generation,
//!    updatedReplicas == replicas == availableReplicas, and every pod left
//!    being one of the new ReplicaSet.
//! 3. **Job.** `completions` completions, `parallelism` at a time: to the
//!    Complete condition.
//! 4. **Namespace deletion.** A namespace holding `objects` ConfigMaps
//!    (created beforehand, not timed): DELETE to GET answering NotFound.
//! 5. **Failover.** SIGKILL the Lease holder: to the Lease naming the other
//!    instance, and to that instance acting (a 10-replica Deployment created
//!    right after the kill has its pods).
//!
//! The node lifecycle controller is left out (`--controllers '*,-nodelifecycle'`):
//! the fake nodes send no heartbeats, and it would taint them mid-run.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::fs::OpenOptions;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use serde_json::{json, Value};
use skiff_api::status::Reason;
use skiff_api::watch::EventType;
use skiff_api::{Kind, ResourceInfo};
use skiff_client::resources::{DeleteParams, ListParams, WatchParams};
use skiff_client::{Client, ClientError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::cluster::{Cluster, ClusterSpec, EtcdTiming, System};

/// Lines between these markers in bench/README.md are replaced by each run
/// of `skiff-bench controllers --readme`.
pub const BEGIN: &str = "<!-- skiff-bench controllers results: begin (written by `make bench-controllers`) -->";
pub const END: &str = "<!-- skiff-bench controllers results: end -->";

/// The namespace of the Deployment and the Job.
const NAMESPACE: &str = "bench";
/// The namespace deleted in step 4.
const DOOMED: &str = "bench-doomed";
const LEASE_NAMESPACE: &str = "kube-system";
const LEASE_NAME: &str = "kube-controller-manager";
/// Fake nodes the stand-in binds pods to, round robin.
const NODES: usize = 10;
/// Pod writes (bind, status, delete) the stand-in has in flight at most.
const STAND_IN_INFLIGHT: usize = 64;
/// Bounds every unary request, so a stuck server fails the run instead of hanging it.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How often progress is polled.
const POLL: Duration = Duration::from_millis(50);
/// Targets of issue 21, seconds.
const PODS_CREATED_TARGET: f64 = 5.0;
const ROLLOUT_TARGET: f64 = 15.0;
const NAMESPACE_TARGET: f64 = 10.0;
const FAILOVER_SLACK: f64 = 1.0;

#[derive(Clone, Debug)]
pub struct ControllersConfig {
    /// The `skiff` executable.
    pub skiff: PathBuf,
    /// The cluster's data and logs go here.
    pub dir: PathBuf,
    pub replicas: usize,
    pub completions: usize,
    pub parallelism: usize,
    /// ConfigMaps in the deleted namespace.
    pub objects: usize,
    pub lease_duration: Duration,
    /// A step that has not finished within this long fails (its figure is missing).
    pub step_timeout: Duration,
    /// Extra flags for both controller managers.
    pub manager_args: Vec<String>,
}

/// One step's figures, seconds; `None`: did not finish within the step timeout.
#[derive(Default)]
pub struct ControllersReport {
    pub pods_created: Option<f64>,
    pub deployment_available: Option<f64>,
    pub rollout: Option<f64>,
    pub job_complete: Option<f64>,
    pub job_detail: String,
    pub namespace_gone: Option<f64>,
    pub namespace_detail: String,
    pub lease_moved: Option<f64>,
    pub new_leader_acts: Option<f64>,
    pub failover_detail: String,
    /// The controller-manager metrics after the steps, a few lines of them.
    pub metrics: Vec<String>,
    pub notes: Vec<String>,
}

fn info(kind: Kind) -> &'static ResourceInfo {
    skiff_api::resources::of(kind)
}

/// A controller-manager process this harness runs.
struct Manager {
    identity: String,
    http: String,
    log: PathBuf,
    child: Option<Child>,
}

impl Manager {
    fn start(config: &ControllersConfig, endpoints: &[String], identity: &str) -> Result<Manager> {
        let http = format!("127.0.0.1:{}", std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port());
        let log = config.dir.join(format!("{identity}.log"));
        let file = OpenOptions::new().create(true).append(true).open(&log)?;
        let lease = humantime::format_duration(config.lease_duration).to_string();
        let child = Command::new(&config.skiff)
            .arg("controller-manager")
            .args(["--server", &endpoints.join(","), "--identity", identity, "--http-listen", &http])
            .args(["--leader-elect-lease-duration", &lease])
            .args(["--controllers", "*,-nodelifecycle"])
            .args(&config.manager_args)
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("starting {} controller-manager", config.skiff.display()))?;
        Ok(Manager { identity: identity.to_string(), http, log, child: Some(child) })
    }

    fn kill(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill().context("SIGKILL")?;
            child.wait().context("reaping a killed controller manager")?;
        }
        Ok(())
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

async fn timed<T>(fut: impl std::future::Future<Output = Result<T, ClientError>>) -> Result<T> {
    match tokio::time::timeout(REQUEST_TIMEOUT, fut).await {
        Ok(r) => Ok(r?),
        Err(_) => bail!("request timed out after {REQUEST_TIMEOUT:?}"),
    }
}

/// Polls `check` every [`POLL`] until it answers `Some`, or `within` passes (`None`).
async fn poll<T, F, Fut>(within: Duration, mut check: F) -> Result<Option<T>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = check().await? {
            return Ok(Some(v));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Launches everything, measures, and stops it (the directory is left to the caller).
pub async fn run(config: &ControllersConfig) -> Result<ControllersReport> {
    if config.replicas == 0 || config.completions == 0 || config.parallelism == 0 || config.objects == 0 {
        bail!("--replicas, --completions, --parallelism and --objects must be positive");
    }
    let spec = ClusterSpec {
        system: System::Skiff,
        binary: config.skiff.clone(),
        members: 3,
        dir: config.dir.clone(),
        etcd_timing: EtcdTiming { heartbeat_ms: 40, election_timeout_ms: 200 },
        extra_args: Vec::new(),
        skiff_subcommand: "apiserver",
    };
    eprintln!("== Skiff: starting 3 members and 2 controller managers in {}", config.dir.display());
    let cluster = Cluster::launch(spec).await?;
    let endpoints = cluster.endpoints();
    let client = Client::new(&endpoints)?;
    must_namespace(&client, NAMESPACE).await?;
    for i in 0..NODES {
        create_node(&client, i).await?;
    }
    let mut managers = vec![Manager::start(config, &endpoints, "cm-1")?, Manager::start(config, &endpoints, "cm-2")?];
    let holder = poll(Duration::from_secs(60), || lease_holder(&client))
        .await?
        .context("no controller manager took the Lease within 60s")?;
    eprintln!("  Lease held by {holder}");

    let stand_in = StandIn::start(&endpoints).await?;
    let mut report = ControllersReport::default();
    let within = config.step_timeout;

    eprintln!("  1. Deployment of {} replicas", config.replicas);
    let started = Instant::now();
    let base = stand_in.created(NAMESPACE);
    create_deployment(&client, "web", config.replicas, "busybox:1").await?;
    report.pods_created = poll(within, || async {
        Ok((stand_in.created(NAMESPACE) >= base + config.replicas).then(|| started.elapsed().as_secs_f64()))
    })
    .await?;
    eprintln!("     pods created: {}", seconds(report.pods_created));
    report.deployment_available = poll(within, || async {
        let d = timed(client.get(info(Kind::Deployment), NAMESPACE, "web")).await?;
        let field = |name: &str| d["status"][name].as_u64().unwrap_or(0) as usize;
        let done = field("availableReplicas") == config.replicas && field("updatedReplicas") == config.replicas;
        Ok(done.then(|| started.elapsed().as_secs_f64()))
    })
    .await?;
    eprintln!("     available: {}", seconds(report.deployment_available));

    eprintln!("  2. rolling update");
    let started = Instant::now();
    let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "busybox:2"}]}}}});
    timed(client.patch(info(Kind::Deployment), NAMESPACE, "web", "strategic", &patch, "")).await?;
    report.rollout = poll(within, || async {
        Ok(rolled_out(&client, "web", config.replicas).await?.then(|| started.elapsed().as_secs_f64()))
    })
    .await?;
    eprintln!("     rolled out: {}", seconds(report.rollout));
    // The Deployment and (below) the Job stay: deleting them would have the
    // garbage collector deleting their pods during the later steps.

    eprintln!("  3. Job of {} completions, parallelism {}", config.completions, config.parallelism);
    let (job_complete, job_detail) = job(&client, config).await?;
    report.job_complete = job_complete;
    report.job_detail = job_detail;
    eprintln!("     complete: {} ({})", seconds(report.job_complete), report.job_detail);

    eprintln!("  4. namespace with {} ConfigMaps", config.objects);
    let (namespace_gone, namespace_detail) = delete_namespace(&client, &endpoints, config).await?;
    report.namespace_gone = namespace_gone;
    report.namespace_detail = namespace_detail;
    eprintln!("     gone: {} ({})", seconds(report.namespace_gone), report.namespace_detail);

    eprintln!("  5. failover");
    report.metrics = scrape_metrics(&managers, &client).await;
    failover(&client, &stand_in, &mut managers, config, &mut report).await?;
    eprintln!(
        "     Lease moved: {}, new leader acts: {} ({})",
        seconds(report.lease_moved),
        seconds(report.new_leader_acts),
        report.failover_detail
    );
    stand_in.stop();
    drop(managers);
    drop(cluster);
    Ok(report)
}

fn seconds(v: Option<f64>) -> String {
    v.map(|s| format!("{s:.2} s")).unwrap_or_else(|| "did not finish".into())
}

async fn must_namespace(client: &Client, name: &str) -> Result<()> {
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match tokio::time::timeout(REQUEST_TIMEOUT, client.create(info(Kind::Namespace), "", &ns)).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(e)) if e.is(Reason::AlreadyExists) => return Ok(()),
            _ if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(200)).await,
            Ok(Err(e)) => bail!("creating namespace {name}: {e}"),
            Err(_) => bail!("creating namespace {name}: timed out"),
        }
    }
}

fn node_name(i: usize) -> String {
    format!("bench-node-{i}")
}

async fn create_node(client: &Client, i: usize) -> Result<()> {
    let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node_name(i)}});
    match tokio::time::timeout(REQUEST_TIMEOUT, client.create(info(Kind::Node), "", &node)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) if e.is(Reason::AlreadyExists) => {}
        Ok(Err(e)) => return Err(anyhow::Error::from(e).context("creating a node")),
        Err(_) => bail!("creating a node timed out"),
    }
    let status = json!({"status": {
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        "addresses": [{"type": "InternalIP", "address": format!("10.0.0.{}", i + 1)}],
        "capacity": {"cpu": "64", "memory": "256Gi", "pods": "1000"},
        "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "1000"},
    }});
    timed(client.patch(info(Kind::Node), "", &node_name(i), "merge", &status, "status")).await?;
    Ok(())
}

async fn lease_holder(client: &Client) -> Result<Option<String>> {
    match tokio::time::timeout(REQUEST_TIMEOUT, client.get(info(Kind::Lease), LEASE_NAMESPACE, LEASE_NAME)).await {
        Ok(Ok(lease)) => Ok(lease["spec"]["holderIdentity"].as_str().filter(|h| !h.is_empty()).map(str::to_string)),
        Ok(Err(e)) if e.is(Reason::NotFound) => Ok(None),
        Ok(Err(e)) => Err(e.into()),
        Err(_) => bail!("reading the Lease timed out"),
    }
}

fn labels(app: &str) -> Value {
    json!({"app": app})
}

async fn create_deployment(client: &Client, name: &str, replicas: usize, image: &str) -> Result<()> {
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels(name)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
            "template": {
                "metadata": {"labels": labels(name)},
                "spec": {"containers": [{"name": "c", "image": image}]},
            },
        },
    });
    timed(client.create(info(Kind::Deployment), NAMESPACE, &deployment)).await?;
    Ok(())
}

/// The Deployment's rollout is complete and no pod of an older ReplicaSet is left.
async fn rolled_out(client: &Client, name: &str, replicas: usize) -> Result<bool> {
    let d = timed(client.get(info(Kind::Deployment), NAMESPACE, name)).await?;
    let status = |field: &str| d["status"][field].as_i64().unwrap_or(-1);
    let generation = d["metadata"]["generation"].as_i64().unwrap_or(0);
    let n = replicas as i64;
    if status("observedGeneration") < generation
        || status("updatedReplicas") != n
        || status("replicas") != n
        || status("availableReplicas") != n
    {
        return Ok(false);
    }
    let params = ListParams { label_selector: format!("app={name}"), ..Default::default() };
    let pods = timed(client.list_all(info(Kind::Pod), NAMESPACE, &params)).await?;
    let image_of = |pod: &Value| pod["spec"]["containers"][0]["image"].as_str().unwrap_or_default().to_string();
    let want = d["spec"]["template"]["spec"]["containers"][0]["image"].as_str().unwrap_or_default().to_string();
    Ok(pods.items.len() == replicas && pods.items.iter().all(|p| image_of(p) == want))
}

async fn job(client: &Client, config: &ControllersConfig) -> Result<(Option<f64>, String)> {
    let job = json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "batch", "namespace": NAMESPACE},
        "spec": {
            "completions": config.completions,
            "parallelism": config.parallelism,
            "backoffLimit": 6,
            "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox:1"}]}},
        },
    });
    let started = Instant::now();
    timed(client.create(info(Kind::Job), NAMESPACE, &job)).await?;
    let last = Arc::new(Mutex::new((0i64, Instant::now())));
    let done = poll(config.step_timeout, || {
        let last = last.clone();
        async move {
            let job = timed(client.get(info(Kind::Job), NAMESPACE, "batch")).await?;
            let succeeded = job["status"]["succeeded"].as_i64().unwrap_or(0);
            {
                let mut last = last.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
                if succeeded != last.0 {
                    *last = (succeeded, Instant::now());
                } else if last.1.elapsed() > Duration::from_secs(30) {
                    // No progress for 30 s: give up on this step.
                    return Ok(Some(None));
                }
            }
            let complete = job["status"]["conditions"]
                .as_array()
                .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Complete" && c["status"] == "True"));
            Ok(complete.then(|| Some(started.elapsed().as_secs_f64())))
        }
    })
    .await?
    .flatten();
    let job = timed(client.get(info(Kind::Job), NAMESPACE, "batch")).await?;
    let (succeeded, active) =
        (job["status"]["succeeded"].as_i64().unwrap_or(0), job["status"]["active"].as_i64().unwrap_or(0));
    let mut detail =
        format!("status.succeeded {succeeded}, active {active}, after {:.1}s", started.elapsed().as_secs_f64());
    if done.is_none() && succeeded == 0 && active == 0 {
        detail.push_str("; no pod of the Job was ever created: no Job controller ran");
    }
    Ok((done, detail))
}

async fn delete_namespace(
    client: &Client,
    endpoints: &[String],
    config: &ControllersConfig,
) -> Result<(Option<f64>, String)> {
    must_namespace(client, DOOMED).await?;
    let fill = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let mut creators = JoinSet::new();
    for _ in 0..64 {
        let client = Client::new(endpoints)?;
        let next = next.clone();
        let objects = config.objects;
        creators.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= objects {
                    return Ok::<(), anyhow::Error>(());
                }
                let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": format!("cm-{i:06}"), "namespace": DOOMED}, "data": {"k": "v"}});
                timed(client.create(info(Kind::ConfigMap), DOOMED, &cm)).await?;
            }
        });
    }
    while let Some(r) = creators.join_next().await {
        r??;
    }
    let fill = fill.elapsed();
    let started = Instant::now();
    timed(client.delete(info(Kind::Namespace), "", DOOMED, &DeleteParams::default())).await?;
    let gone = poll(config.step_timeout, || async {
        match tokio::time::timeout(REQUEST_TIMEOUT, client.get(info(Kind::Namespace), "", DOOMED)).await {
            Ok(Err(e)) if e.is(Reason::NotFound) => Ok(Some(started.elapsed().as_secs_f64())),
            Ok(Err(e)) => Err(e.into()),
            _ => Ok(None),
        }
    })
    .await?;
    let left = match gone {
        Some(_) => String::new(),
        None => {
            let params = ListParams { limit: 1, ..Default::default() };
            let list = timed(client.list(info(Kind::ConfigMap), DOOMED, &params)).await?;
            format!(", {} ConfigMaps left", list.remaining_item_count.unwrap_or(0) + list.items.len() as i64)
        }
    };
    Ok((gone, format!("{} ConfigMaps created beforehand in {:.1}s{left}", config.objects, fill.as_secs_f64())))
}

async fn failover(
    client: &Client,
    stand_in: &StandIn,
    managers: &mut [Manager],
    config: &ControllersConfig,
    report: &mut ControllersReport,
) -> Result<()> {
    let holder = lease_holder(client).await?.context("nobody holds the Lease")?;
    let Some(victim) = managers.iter().position(|m| m.identity == holder) else {
        bail!("the Lease holder {holder} is none of this harness's controller managers");
    };
    let lease = timed(client.get(info(Kind::Lease), LEASE_NAMESPACE, LEASE_NAME)).await?;
    let renewed = lease["spec"]["renewTime"].as_str().unwrap_or("?").to_string();
    managers[victim].kill()?;
    let killed = Instant::now();
    let since_renew = humantime::parse_rfc3339_weak(&renewed)
        .ok()
        .and_then(|at| std::time::SystemTime::now().duration_since(at).ok())
        .map(|d| format!("{:.2}s", d.as_secs_f64()))
        .unwrap_or_else(|| "?".into());
    let base = stand_in.created(NAMESPACE);
    let replicas = 10;
    create_deployment(client, "after-failover", replicas, "busybox:1").await?;
    let within = config.lease_duration + config.step_timeout;
    let lease_moved = async {
        poll(within, || async {
            Ok(lease_holder(client).await?.filter(|h| *h != holder).map(|_| killed.elapsed().as_secs_f64()))
        })
        .await
    };
    let acts = async {
        poll(within, || async {
            Ok((stand_in.created(NAMESPACE) >= base + replicas).then(|| killed.elapsed().as_secs_f64()))
        })
        .await
    };
    let (moved, acted) = tokio::join!(lease_moved, acts);
    report.lease_moved = moved?;
    report.new_leader_acts = acted?;
    report.failover_detail =
        format!("killed {holder} {since_renew} after its last renewTime; lease duration {:?}", config.lease_duration);
    Ok(())
}

/// `skiff_controller_*` lines of interest from the Lease holder's `/metrics`.
async fn scrape_metrics(managers: &[Manager], client: &Client) -> Vec<String> {
    let holder = lease_holder(client).await.ok().flatten().unwrap_or_default();
    let Some(manager) = managers.iter().find(|m| m.identity == holder) else { return Vec::new() };
    let body = match http_get(&manager.http, "/metrics").await {
        Ok(body) => body,
        Err(e) => return vec![format!("scraping {}: {e:#}", manager.http)],
    };
    let _ = std::fs::write(manager.log.with_extension("metrics"), &body);
    body.lines()
        .filter(|l| {
            (l.starts_with("skiff_controller_reconciles_total")
                || l.starts_with("skiff_controller_retries_total")
                || l.starts_with("skiff_controller_reconcile_duration_seconds_sum")
                || l.starts_with("skiff_controller_reconcile_duration_seconds_count"))
                && !l.ends_with(" 0")
        })
        .map(str::to_string)
        .collect()
}

pub(crate) async fn http_get(addr: &str, path: &str) -> Result<String> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes()).await?;
    let mut body = String::new();
    tokio::time::timeout(REQUEST_TIMEOUT, stream.read_to_string(&mut body)).await??;
    Ok(body.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or(body))
}

/// The scheduler and kubelets: binds new pods, makes them Running and
/// Ready (or Succeeded), and finishes deletions at once.
struct StandIn {
    created: Arc<Mutex<std::collections::HashMap<String, usize>>>,
    stopping: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct Seen {
    bound: HashSet<String>,
    deleting: HashSet<String>,
}

impl StandIn {
    async fn start(endpoints: &[String]) -> Result<StandIn> {
        let client = Client::new(endpoints)?;
        let created = Arc::new(Mutex::new(std::collections::HashMap::new()));
        let counts = created.clone();
        let list = timed(client.list(info(Kind::Pod), "", &ListParams::default())).await?;
        let from = list.resource_version;
        let stopping = Arc::new(AtomicBool::new(false));
        let stop = stopping.clone();
        let task = tokio::spawn(async move {
            if let Err(e) = stand_in(client, counts, from, stop).await {
                eprintln!("skiff-bench: the stand-in kubelet stopped: {e:#}");
            }
        });
        Ok(StandIn { created, stopping, task })
    }

    /// Pods created in `namespace` since the stand-in started.
    fn created(&self, namespace: &str) -> usize {
        self.created.lock().map(|c| c.get(namespace).copied().unwrap_or(0)).unwrap_or(0)
    }

    fn stop(&self) {
        self.stopping.store(true, Ordering::Relaxed);
        self.task.abort();
    }
}

async fn stand_in(
    client: Client,
    created: Arc<Mutex<std::collections::HashMap<String, usize>>>,
    mut from: String,
    stopping: Arc<AtomicBool>,
) -> Result<()> {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let inflight = Arc::new(Semaphore::new(STAND_IN_INFLIGHT));
    let next_node = AtomicUsize::new(0);
    loop {
        let params = WatchParams { resource_version: from.clone(), ..Default::default() };
        let mut stream = match client.watch(info(Kind::Pod), "", &params).await {
            Ok(s) => Box::pin(s),
            Err(e) => {
                eprintln!("skiff-bench: stand-in watch: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        while let Some(event) = stream.next().await {
            let event = match event {
                Ok(event) => event,
                Err(e) => {
                    eprintln!("skiff-bench: stand-in watch ended: {e}");
                    break;
                }
            };
            if let Some(rv) = event.resource_version() {
                from = rv.to_string();
            }
            if !matches!(event.kind, EventType::Added | EventType::Modified) {
                continue;
            }
            let pod = event.object;
            let meta = &pod["metadata"];
            let uid = meta["uid"].as_str().unwrap_or_default().to_string();
            let namespace = meta["namespace"].as_str().unwrap_or_default().to_string();
            let name = meta["name"].as_str().unwrap_or_default().to_string();
            let action = {
                let mut seen = seen.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
                if !meta["deletionTimestamp"].is_null() {
                    seen.deleting.insert(uid.clone()).then_some(Action::Delete)
                } else if pod["spec"]["nodeName"].as_str().unwrap_or_default().is_empty()
                    && seen.bound.insert(uid.clone())
                {
                    if let Ok(mut c) = created.lock() {
                        *c.entry(namespace.clone()).or_default() += 1;
                    }
                    let job = !meta["labels"]["job-name"].is_null()
                        || !meta["labels"]["batch.kubernetes.io/job-name"].is_null();
                    Some(Action::Start { job })
                } else {
                    None
                }
            };
            let Some(action) = action else { continue };
            let permit = inflight.clone().acquire_owned().await?;
            let client = client.clone();
            let stopping = stopping.clone();
            let node = node_name(next_node.fetch_add(1, Ordering::Relaxed) % NODES);
            tokio::spawn(async move {
                let _permit = permit;
                let result = match action {
                    Action::Delete => {
                        let params = DeleteParams { grace_period_seconds: Some(0), ..Default::default() }.with_uid(uid);
                        match tokio::time::timeout(
                            REQUEST_TIMEOUT,
                            client.delete(info(Kind::Pod), &namespace, &name, &params),
                        )
                        .await
                        {
                            Ok(Ok(_)) => Ok(()),
                            Ok(Err(e)) if e.is(Reason::NotFound) => Ok(()),
                            Ok(Err(e)) => Err(e.into()),
                            Err(_) => Err(anyhow::anyhow!("deleting timed out")),
                        }
                    }
                    Action::Start { job } => start_pod(&client, &namespace, &name, &node, job).await,
                };
                // After the run the cluster goes first: failures then are noise.
                if let Err(e) = result {
                    if !stopping.load(Ordering::Relaxed) {
                        eprintln!("skiff-bench: stand-in on pod {namespace}/{name}: {e:#}");
                    }
                }
            });
        }
    }
}

enum Action {
    Start { job: bool },
    Delete,
}

async fn start_pod(client: &Client, namespace: &str, name: &str, node: &str, job: bool) -> Result<()> {
    timed(client.bind(namespace, name, node)).await?;
    let now = chrono_now();
    let condition = |kind: &str, status: &str| json!({"type": kind, "status": status, "lastTransitionTime": now});
    let n = name.bytes().fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(b as u32));
    let ip = format!("10.244.{}.{}", (n >> 8) % 250, n % 250 + 2);
    let status = if job {
        json!({"status": {
            "phase": "Succeeded", "podIP": ip, "startTime": now,
            "conditions": [condition("PodScheduled", "True"), condition("Ready", "False"),
                           condition("ContainersReady", "False")],
            "containerStatuses": [{"name": "c", "image": "busybox:1", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}}}],
        }})
    } else {
        json!({"status": {
            "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "startTime": now,
            "conditions": [condition("PodScheduled", "True"), condition("Initialized", "True"),
                           condition("ContainersReady", "True"), condition("Ready", "True")],
            "containerStatuses": [{"name": "c", "image": "busybox", "ready": true, "started": true,
                "restartCount": 0, "state": {"running": {"startedAt": now}}}],
        }})
    };
    timed(client.patch(info(Kind::Pod), namespace, name, "merge", &status, "status")).await?;
    Ok(())
}

/// Now as RFC 3339 with seconds, as Kubernetes writes times.
fn chrono_now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

impl ControllersReport {
    pub fn table(&self, config: &ControllersConfig) -> String {
        let mut out = String::new();
        out.push_str("| step | time | target | verdict |\n| --- | ---: | ---: | --- |\n");
        let lease = config.lease_duration.as_secs_f64();
        let rows: [(String, Option<f64>, Option<f64>); 7] = [
            (
                format!("Deployment of {}: all pods created", config.replicas),
                self.pods_created,
                Some(PODS_CREATED_TARGET),
            ),
            (format!("Deployment of {}: all available", config.replicas), self.deployment_available, None),
            (format!("rolling update of {}", config.replicas), self.rollout, Some(ROLLOUT_TARGET)),
            (
                format!("Job, {} completions, parallelism {}", config.completions, config.parallelism),
                self.job_complete,
                None,
            ),
            (
                format!("delete a namespace of {} ConfigMaps", config.objects),
                self.namespace_gone,
                Some(NAMESPACE_TARGET),
            ),
            ("failover: Lease taken by the other instance".into(), self.lease_moved, Some(lease + FAILOVER_SLACK)),
            ("failover: new leader's pods for a new Deployment".into(), self.new_leader_acts, None),
        ];
        for (step, value, target) in rows {
            let verdict = match (value, target) {
                (None, _) => "did not finish",
                (Some(_), None) => "-",
                (Some(v), Some(t)) if v < t => "met",
                (Some(_), Some(_)) => "NOT met",
            };
            let target = target.map(|t| format!("< {t:.0} s")).unwrap_or_else(|| "-".into());
            let _ = writeln!(out, "| {step} | {} | {target} | {verdict} |", seconds(value));
        }
        out
    }

    pub fn markdown(
        &self,
        config: &ControllersConfig,
        date: &str,
        command: &str,
        machine: &[(String, String)],
    ) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "Last run: {date}, with `{command}`.\n");
        out.push_str(&self.table(config));
        out.push_str("\nDetails:\n\n");
        let _ = writeln!(out, "- Job: {}", self.job_detail);
        let _ = writeln!(out, "- namespace: {}", self.namespace_detail);
        let _ = writeln!(out, "- failover: {}", self.failover_detail);
        for note in &self.notes {
            let _ = writeln!(out, "- {note}");
        }
        if !self.metrics.is_empty() {
            out.push_str("\nThe Lease holder's controller metrics before the failover step:\n\n```\n");
            for line in &self.metrics {
                let _ = writeln!(out, "{line}");
            }
            out.push_str("```\n");
        }
        out.push_str("\nMachine:\n\n");
        for (name, value) in machine {
            let _ = writeln!(out, "- {name}: {value}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ControllersConfig {
        ControllersConfig {
            skiff: PathBuf::from("skiff"),
            dir: PathBuf::from("/tmp"),
            replicas: 1000,
            completions: 10_000,
            parallelism: 500,
            objects: 10_000,
            lease_duration: Duration::from_secs(15),
            step_timeout: Duration::from_secs(60),
            manager_args: Vec::new(),
        }
    }

    #[test]
    fn table_checks_each_figure_against_its_target() {
        let report = ControllersReport {
            pods_created: Some(3.2),
            rollout: Some(20.0),
            lease_moved: Some(15.5),
            ..Default::default()
        };
        let table = report.table(&config());
        assert!(table.contains("| Deployment of 1000: all pods created | 3.20 s | < 5 s | met |"), "{table}");
        assert!(table.contains("| rolling update of 1000 | 20.00 s | < 15 s | NOT met |"), "{table}");
        assert!(table.contains("| delete a namespace of 10000 ConfigMaps | did not finish | < 10 s | did not finish |"));
        assert!(table.contains("Lease taken by the other instance | 15.50 s | < 16 s | met |"), "{table}");
    }
}
