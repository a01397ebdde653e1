//! The resource metrics API, `metrics.k8s.io/v1beta1`, which `kubectl top`
//! reads: NodeMetrics and PodMetrics, answered on request from the node
//! agents' `/stats/summary` (their CPU rates over the last housekeeping
//! window and memory working sets), as metrics-server answers them from
//! the kubelets' summaries, without an aggregated API server to run.
//!
//! Who may read them: whoever may list (or get) the nodes, or the pods
//! in the namespace, the metrics are of. A node that does not answer
//! within [`SCRAPE_TIMEOUT`] is left out, as are pods whose containers
//! have no CPU rate yet (metrics-server's rule): `kubectl top` then says
//! the metrics are not available yet.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use axum::http::{Method, StatusCode, Uri};
use axum::response::Response;
use bytes::Bytes;
use futures::future::join_all;
use http_body_util::{BodyExt, Empty};
use serde_json::{json, Value};
use skiff_api::resources::{self, ResourceInfo};
use skiff_api::{ApiError, Reason};

use super::node_proxy::{client, node_url};
use super::value_response;
use crate::registry::{Context, ListOptions, Registry};

/// The group and version served.
pub const GROUP: &str = "metrics.k8s.io";
/// The only version, as metrics-server serves it.
pub const VERSION: &str = "v1beta1";
/// How long a node has to answer a scrape.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

/// The resources: (plural, kind, singular, namespaced).
pub const RESOURCES: [(&str, &str, &str, bool); 2] =
    [("nodes", "NodeMetrics", "nodemetrics", false), ("pods", "PodMetrics", "podmetrics", true)];

fn core(plural: &str) -> &'static ResourceInfo {
    resources::by_plural(Some(""), plural).expect("core resource is served")
}

/// What a metrics request names.
pub struct MetricsRequest<'a> {
    pub resource: &'a str,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
    pub sub: Option<&'a str>,
    pub label_selector: String,
}

/// Serves `GET /apis/metrics.k8s.io/v1beta1/...`.
pub async fn serve(
    registry: &Registry,
    ctx: &Context,
    method: &Method,
    request: MetricsRequest<'_>,
) -> Result<Response, ApiError> {
    if method != Method::GET {
        return Err(ApiError::method_not_allowed(format!("{method} is not supported on {GROUP}")));
    }
    if request.sub.is_some() {
        return Err(ApiError::new(Reason::NotFound, "the server could not find the requested resource"));
    }
    let answer = match (request.resource, request.namespace) {
        ("nodes", None) => node_metrics(registry, ctx, request.name, &request.label_selector).await?,
        ("pods", namespace) => {
            pod_metrics(registry, ctx, namespace.unwrap_or(""), request.name, &request.label_selector).await?
        }
        _ => return Err(ApiError::new(Reason::NotFound, "the server could not find the requested resource")),
    };
    Ok(value_response(StatusCode::OK, &answer))
}

fn not_found(singular: &str, name: &str) -> ApiError {
    ApiError::new(Reason::NotFound, format!("{singular}.{GROUP} \"{name}\" not found"))
}

fn list_of(kind: &str, items: Vec<Value>) -> Value {
    json!({"kind": format!("{kind}List"), "apiVersion": format!("{GROUP}/{VERSION}"), "metadata": {}, "items": items})
}

async fn list(
    registry: &Registry,
    ctx: &Context,
    info: &'static ResourceInfo,
    namespace: &str,
    label_selector: &str,
) -> Result<Vec<Value>, ApiError> {
    let opts = ListOptions { label_selector: label_selector.to_string(), ..ListOptions::default() };
    let page = registry.list(ctx, info, namespace, &opts).await?;
    page.items
        .iter()
        .map(|b| serde_json::from_slice(b).map_err(|e| ApiError::internal(format!("stored object: {e}"))))
        .collect()
}

async fn node_metrics(
    registry: &Registry,
    ctx: &Context,
    name: Option<&str>,
    label_selector: &str,
) -> Result<Value, ApiError> {
    let nodes = match name {
        Some(n) => match registry.get(ctx, core("nodes"), "", n, "").await {
            Ok(node) => vec![node],
            Err(e) if e.reason == Reason::NotFound => return Err(not_found("nodemetrics", n)),
            Err(e) => return Err(e),
        },
        None => list(registry, ctx, core("nodes"), "", label_selector).await?,
    };
    let summaries = scrape(&nodes).await;
    let items: Vec<Value> = nodes
        .iter()
        .filter_map(|node| {
            let node_name = node["metadata"]["name"].as_str()?;
            let summary = summaries.get(node_name)?;
            let usage = usage(&summary["node"])?;
            Some(json!({
                "kind": "NodeMetrics",
                "apiVersion": format!("{GROUP}/{VERSION}"),
                "metadata": {
                    "name": node_name,
                    "creationTimestamp": now(),
                    "labels": node["metadata"]["labels"].clone(),
                },
                "timestamp": summary["node"]["cpu"]["time"].clone(),
                "window": window(summary),
                "usage": usage,
            }))
        })
        .collect();
    match name {
        Some(n) => items.into_iter().next().ok_or_else(|| not_found("nodemetrics", n)),
        None => Ok(list_of("NodeMetrics", items)),
    }
}

async fn pod_metrics(
    registry: &Registry,
    ctx: &Context,
    namespace: &str,
    name: Option<&str>,
    label_selector: &str,
) -> Result<Value, ApiError> {
    let pods = match name {
        Some(n) => match registry.get(ctx, core("pods"), namespace, n, "").await {
            Ok(pod) => vec![pod],
            Err(e) if e.reason == Reason::NotFound => return Err(not_found("podmetrics", n)),
            Err(e) => return Err(e),
        },
        None => list(registry, ctx, core("pods"), namespace, label_selector).await?,
    };
    // Only the nodes running these pods are asked, with the apiserver's
    // own rights: reading pod metrics does not need reading Nodes.
    let mut node_names: Vec<&str> = pods.iter().filter_map(|p| p["spec"]["nodeName"].as_str()).collect();
    node_names.sort_unstable();
    node_names.dedup();
    let internal = Context::internal();
    let nodes = join_all(node_names.iter().map(|n| registry.get(&internal, core("nodes"), "", n, ""))).await;
    let nodes: Vec<Value> = nodes.into_iter().filter_map(Result::ok).collect();
    let summaries = scrape(&nodes).await;
    let mut by_pod: HashMap<(&str, &str, &str), (&Value, &Value)> = HashMap::new();
    for summary in summaries.values() {
        for pod in summary["pods"].as_array().into_iter().flatten() {
            let r = &pod["podRef"];
            if let (Some(ns), Some(n), Some(uid)) = (r["namespace"].as_str(), r["name"].as_str(), r["uid"].as_str()) {
                by_pod.insert((ns, n, uid), (pod, summary));
            }
        }
    }
    let items: Vec<Value> = pods
        .iter()
        .filter_map(|pod| {
            let meta = &pod["metadata"];
            let key = (meta["namespace"].as_str()?, meta["name"].as_str()?, meta["uid"].as_str()?);
            let (stats, summary) = by_pod.get(&key)?;
            let containers = stats["containers"]
                .as_array()?
                .iter()
                .map(|c| Some(json!({"name": c["name"].clone(), "usage": usage(c)?})))
                .collect::<Option<Vec<Value>>>()?;
            Some(json!({
                "kind": "PodMetrics",
                "apiVersion": format!("{GROUP}/{VERSION}"),
                "metadata": {
                    "name": key.1,
                    "namespace": key.0,
                    "creationTimestamp": now(),
                    "labels": meta["labels"].clone(),
                },
                "timestamp": stats["cpu"]["time"].clone(),
                "window": window(summary),
                "containers": containers,
            }))
        })
        .collect();
    match name {
        Some(n) => items.into_iter().next().ok_or_else(|| not_found("podmetrics", n)),
        None => Ok(list_of("PodMetrics", items)),
    }
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn window(summary: &Value) -> Value {
    summary.get("window").cloned().unwrap_or_else(|| json!("10s"))
}

/// `{"cpu": "<n>n", "memory": "<k>Ki"}` from a summary's cpu and memory,
/// if the CPU rate is known.
pub fn usage(stats: &Value) -> Option<Value> {
    let nano_cores = stats["cpu"]["usageNanoCores"].as_u64()?;
    let memory = stats["memory"]["workingSetBytes"].as_u64().unwrap_or(0);
    let memory = if memory.is_multiple_of(1024) { format!("{}Ki", memory / 1024) } else { memory.to_string() };
    Some(json!({"cpu": format!("{nano_cores}n"), "memory": memory}))
}

/// Each node's `/stats/summary`, by node name; nodes that do not answer
/// in time are left out (and logged).
async fn scrape(nodes: &[Value]) -> BTreeMap<String, Value> {
    let asks = nodes.iter().filter_map(|node| {
        let name = node["metadata"]["name"].as_str()?.to_string();
        let url = node_url(node).ok()?;
        Some(async move {
            match tokio::time::timeout(SCRAPE_TIMEOUT, summary_of(&url)).await {
                Ok(Ok(summary)) => Some((name, summary)),
                Ok(Err(e)) => {
                    tracing::debug!(node = %name, error = %e, "no summary from the node");
                    None
                }
                Err(_) => {
                    tracing::debug!(node = %name, "the node's summary timed out");
                    None
                }
            }
        })
    });
    join_all(asks).await.into_iter().flatten().collect()
}

async fn summary_of(node_url: &str) -> Result<Value, String> {
    let uri: Uri = format!("{node_url}/stats/summary").parse().map_err(|e| format!("{e}"))?;
    let answer = client::<Empty<Bytes>>().get(uri).await.map_err(|e| e.to_string())?;
    if !answer.status().is_success() {
        return Err(format!("answered {}", answer.status()));
    }
    let body = answer.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
    serde_json::from_slice(&body).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_is_nanocores_and_kibibytes_as_metrics_server_writes_them() {
        let stats = json!({"cpu": {"usageNanoCores": 1_500_000}, "memory": {"workingSetBytes": 2048}});
        assert_eq!(usage(&stats), Some(json!({"cpu": "1500000n", "memory": "2Ki"})));
        let odd = json!({"cpu": {"usageNanoCores": 0}, "memory": {"workingSetBytes": 1000}});
        assert_eq!(usage(&odd), Some(json!({"cpu": "0n", "memory": "1000"})));
    }

    #[test]
    fn no_cpu_rate_yet_means_no_metrics() {
        let stats = json!({"cpu": {"usageCoreNanoSeconds": 5}, "memory": {"workingSetBytes": 2048}});
        assert_eq!(usage(&stats), None);
    }
}
