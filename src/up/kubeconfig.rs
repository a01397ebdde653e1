//! The kubeconfig `skiff up` writes beside its data: context `skiff` for
//! the cluster (master 1's HTTP port) and one context per master, so that
//! `kubectl --context skiff-master-2` reaches that master alone.

use std::path::Path;

use serde_json::{json, Value};

use super::MasterAddrs;

/// The name of the cluster-wide cluster, user and context.
pub const CONTEXT: &str = "skiff";

/// The kubeconfig for `masters` (master 1 first) as YAML.
pub fn render(masters: &[MasterAddrs]) -> String {
    let server = |m: &MasterAddrs| format!("http://{}", m.http);
    let mut clusters = Vec::new();
    let mut contexts = Vec::new();
    if let Some(first) = masters.first() {
        clusters.push(json!({"name": CONTEXT, "cluster": {"server": server(first)}}));
        contexts.push(json!({"name": CONTEXT, "context": {"cluster": CONTEXT, "user": CONTEXT}}));
    }
    for m in masters {
        let name = format!("{CONTEXT}-{}", m.name);
        clusters.push(json!({"name": name, "cluster": {"server": server(m)}}));
        contexts.push(json!({"name": name, "context": {"cluster": name, "user": CONTEXT}}));
    }
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": clusters,
        "contexts": contexts,
        "current-context": CONTEXT,
        // No credentials: the apiserver's authentication allows everyone for now.
        "users": [{"name": CONTEXT, "user": {}}],
        "preferences": {},
    });
    to_yaml(&config)
}

fn to_yaml(v: &Value) -> String {
    serde_yaml::to_string(v).expect("a JSON value always serializes as YAML")
}

/// Writes the kubeconfig to `path` through a temporary file and a rename,
/// so that a reader never sees half of it.
pub fn write(path: &Path, masters: &[MasterAddrs]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, render(masters))?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn master(i: u16) -> MasterAddrs {
        MasterAddrs {
            id: i.into(),
            name: format!("master-{i}"),
            client: format!("127.0.0.1:{}", 2379 + 10 * (i - 1)),
            peer: format!("127.0.0.1:{}", 2380 + 10 * (i - 1)),
            http: format!("127.0.0.1:{}", 6443 + 10 * (i - 1)),
        }
    }

    #[test]
    fn one_context_for_the_cluster_and_one_per_master() {
        let yaml = render(&[master(1), master(2), master(3)]);
        let v: Value = serde_yaml::from_str(&yaml).unwrap();
        assert_eq!(v["current-context"], "skiff");
        let servers: Vec<(&str, &str)> = v["clusters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["name"].as_str().unwrap(), c["cluster"]["server"].as_str().unwrap()))
            .collect();
        assert_eq!(
            servers,
            [
                ("skiff", "http://127.0.0.1:6443"),
                ("skiff-master-1", "http://127.0.0.1:6443"),
                ("skiff-master-2", "http://127.0.0.1:6453"),
                ("skiff-master-3", "http://127.0.0.1:6463"),
            ]
        );
        let contexts: Vec<(&str, &str)> = v["contexts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["name"].as_str().unwrap(), c["context"]["cluster"].as_str().unwrap()))
            .collect();
        assert_eq!(contexts[0], ("skiff", "skiff"));
        assert_eq!(contexts[3], ("skiff-master-3", "skiff-master-3"));
        assert!(v["contexts"].as_array().unwrap().iter().all(|c| c["context"]["user"] == "skiff"));
    }
}
