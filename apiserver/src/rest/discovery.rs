//! Discovery for kubectl: `/version`, `/api`, `/apis` in both
//! the aggregated (apidiscovery.k8s.io/v2) and the legacy formats, the
//! per-group-version resource lists (the OpenAPI documents built from the
//! same catalog are in `openapi`). What kubectl sends and expects is in
//! KUBECTL.md §2.

use serde_json::{json, Value};
use skiff_api::resources::{catalog, ResourceInfo};

/// The Content-Type that tells kubectl a discovery answer is aggregated.
pub const AGGREGATED: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// Groups served besides the catalog's: the review APIs `kubectl auth` uses.
const REVIEWS: [(&str, &str, &str, &str); 2] = [
    ("authorization.k8s.io", "selfsubjectaccessreviews", "SelfSubjectAccessReview", "selfsubjectaccessreview"),
    ("authentication.k8s.io", "selfsubjectreviews", "SelfSubjectReview", "selfsubjectreview"),
];

const VERBS: [&str; 7] = ["create", "delete", "get", "list", "patch", "update", "watch"];

pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "32",
        "gitVersion": concat!("v1.32.0-skiff.", env!("CARGO_PKG_VERSION")),
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "",
        "goVersion": "",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
    })
}

/// Every group with served resources, core ("") first, then by name.
pub(super) fn groups() -> Vec<&'static str> {
    let mut groups: Vec<&str> = catalog().iter().map(|r| r.group).collect();
    groups.extend(REVIEWS.iter().map(|r| r.0));
    groups.sort();
    groups.dedup();
    groups
}

fn in_group(group: &str) -> impl Iterator<Item = &'static ResourceInfo> + '_ {
    catalog().iter().filter(move |r| r.group == group)
}

/// The kind a subresource answers with.
pub(super) fn subresource_kind(info: &ResourceInfo, sub: &str) -> (String, String, String) {
    match sub {
        "scale" => ("autoscaling".into(), "v1".into(), "Scale".into()),
        "binding" => (String::new(), "v1".into(), "Binding".into()),
        "exec" => (String::new(), "v1".into(), "PodExecOptions".into()),
        "attach" => (String::new(), "v1".into(), "PodAttachOptions".into()),
        "portforward" => (String::new(), "v1".into(), "PodPortForwardOptions".into()),
        _ => (info.group.into(), info.version.into(), info.kind.into()),
    }
}

fn subresource_verbs(sub: &str) -> Vec<&'static str> {
    match sub {
        "binding" => vec!["create"],
        "log" => vec!["get"],
        "exec" | "attach" | "portforward" => vec!["create", "get"],
        "finalize" => vec!["update"],
        _ => vec!["get", "patch", "update"],
    }
}

fn aggregated_resource(info: &ResourceInfo) -> Value {
    let subresources: Vec<Value> = info
        .subresources
        .iter()
        .map(|s| {
            let (g, v, k) = subresource_kind(info, s);
            json!({"subresource": s, "responseKind": {"group": g, "version": v, "kind": k}, "verbs": subresource_verbs(s)})
        })
        .collect();
    let mut r = json!({
        "resource": info.plural,
        "responseKind": {"group": info.group, "version": info.version, "kind": info.kind},
        "scope": if info.namespaced { "Namespaced" } else { "Cluster" },
        "singularResource": info.singular,
        "verbs": VERBS,
    });
    if !info.short_names.is_empty() {
        r["shortNames"] = json!(info.short_names);
    }
    if !info.categories.is_empty() {
        r["categories"] = json!(info.categories);
    }
    if !subresources.is_empty() {
        r["subresources"] = json!(subresources);
    }
    r
}

pub(super) fn review_resources(
    group: &str,
) -> impl Iterator<Item = &'static (&'static str, &'static str, &'static str, &'static str)> + '_ {
    REVIEWS.iter().filter(move |r| r.0 == group)
}

fn aggregated_group(group: &str) -> Value {
    let mut resources: Vec<Value> = in_group(group).map(aggregated_resource).collect();
    for (g, plural, kind, singular) in review_resources(group) {
        resources.push(json!({
            "resource": plural,
            "responseKind": {"group": g, "version": "v1", "kind": kind},
            "scope": "Cluster",
            "singularResource": singular,
            "verbs": ["create"],
        }));
    }
    let mut metadata = json!({"creationTimestamp": null});
    if !group.is_empty() {
        metadata["name"] = json!(group);
    }
    json!({"metadata": metadata, "versions": [{"version": "v1", "resources": resources, "freshness": "Current"}]})
}

/// `/api` (core) or `/apis` (every other group), aggregated.
pub fn aggregated(core: bool) -> Value {
    let items: Vec<Value> = groups().into_iter().filter(|g| g.is_empty() == core).map(aggregated_group).collect();
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items})
}

/// Legacy `/api`.
pub fn api_versions(server_address: &str) -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]})
}

fn api_group(group: &str) -> Value {
    let gv = json!({"groupVersion": format!("{group}/v1"), "version": "v1"});
    json!({"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": [gv], "preferredVersion": gv})
}

/// Legacy `/apis`.
pub fn api_group_list() -> Value {
    let groups: Vec<Value> = groups().into_iter().filter(|g| !g.is_empty()).map(api_group).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// Legacy `/apis/<group>`, if served.
pub fn group(group: &str) -> Option<Value> {
    groups().contains(&group).then(|| api_group(group)).filter(|_| !group.is_empty())
}

/// Legacy `/api/v1` or `/apis/<group>/v1`, if served.
pub fn resource_list(group: &str, version: &str) -> Option<Value> {
    if version != "v1" || !groups().contains(&group) {
        return None;
    }
    let mut resources = Vec::new();
    for info in in_group(group) {
        let mut r = json!({
            "name": info.plural,
            "singularName": info.singular,
            "namespaced": info.namespaced,
            "kind": info.kind,
            "verbs": VERBS,
        });
        if !info.short_names.is_empty() {
            r["shortNames"] = json!(info.short_names);
        }
        if !info.categories.is_empty() {
            r["categories"] = json!(info.categories);
        }
        resources.push(r);
        for s in info.subresources {
            let (g, v, k) = subresource_kind(info, s);
            let mut sub = json!({"name": format!("{}/{s}", info.plural), "singularName": "", "namespaced": info.namespaced,
                "kind": k, "verbs": subresource_verbs(s)});
            if g != info.group || v != info.version {
                sub["group"] = json!(g);
                sub["version"] = json!(v);
            }
            resources.push(sub);
        }
    }
    for (_, plural, kind, singular) in review_resources(group) {
        resources.push(
            json!({"name": plural, "singularName": singular, "namespaced": false, "kind": kind, "verbs": ["create"]}),
        );
    }
    let group_version = if group.is_empty() { "v1".to_string() } else { format!("{group}/v1") };
    Some(json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aggregated_discovery_lists_every_resource_with_its_kind() {
        let core = aggregated(true);
        let resources = core["items"][0]["versions"][0]["resources"].as_array().unwrap();
        let pods = resources.iter().find(|r| r["resource"] == "pods").unwrap();
        assert_eq!(pods["responseKind"]["kind"], "Pod");
        assert_eq!(pods["categories"], json!(["all"]));
        let apis = aggregated(false);
        let names: Vec<&str> =
            apis["items"].as_array().unwrap().iter().map(|i| i["metadata"]["name"].as_str().unwrap()).collect();
        assert!(names.contains(&"apps") && names.contains(&"authorization.k8s.io"));
        let apps = apis["items"].as_array().unwrap().iter().find(|i| i["metadata"]["name"] == "apps").unwrap();
        let deploy = apps["versions"][0]["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["resource"] == "deployments")
            .unwrap();
        let scale = deploy["subresources"].as_array().unwrap().iter().find(|s| s["subresource"] == "scale").unwrap();
        assert_eq!(scale["responseKind"], json!({"group": "autoscaling", "version": "v1", "kind": "Scale"}));
    }
}
