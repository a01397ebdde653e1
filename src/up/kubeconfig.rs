//! The kubeconfig `skiff up` writes beside its data: context `skiff` for
//! the cluster (master 1's HTTP port) and one context per master, so that
//! `kubectl --context skiff-master-2` reaches that master alone.

use std::path::Path;

use skiff_pki::Issued;

use super::MasterAddrs;

/// The name of the cluster-wide context.
pub const CONTEXT: &str = "skiff";

/// The kubeconfig for `masters` (master 1 first) as YAML: every context
/// trusts the cluster's CA (`ca_pem`) and signs in as the admin.
pub fn render(masters: &[MasterAddrs], ca_pem: &str, admin: &Issued) -> String {
    let server = |m: &MasterAddrs| format!("https://{}", m.http);
    let mut contexts = Vec::new();
    if let Some(first) = masters.first() {
        contexts.push((CONTEXT.to_string(), server(first)));
    }
    contexts.extend(masters.iter().map(|m| (format!("{CONTEXT}-{}", m.name), server(m))));
    let contexts: Vec<(&str, &str)> = contexts.iter().map(|(n, s)| (n.as_str(), s.as_str())).collect();
    skiff_pki::kubeconfig_for(&contexts, ca_pem, skiff_pki::ADMIN_USER, admin)
}

/// Writes the kubeconfig to `path` through a temporary file and a rename,
/// so that a reader never sees half of it; readable by its owner only, as
/// it holds the admin's key.
pub fn write(path: &Path, masters: &[MasterAddrs], ca_pem: &str, admin: &Issued) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
    std::io::Write::write_all(&mut f, render(masters, ca_pem, admin).as_bytes())?;
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
        let admin = Issued { cert_pem: "CERT".into(), key_pem: "KEY".into() };
        let yaml = render(&[master(1), master(2), master(3)], "CA", &admin);
        let v: serde_json::Value = serde_yaml::from_str(&yaml).unwrap();
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
                ("skiff", "https://127.0.0.1:6443"),
                ("skiff-master-1", "https://127.0.0.1:6443"),
                ("skiff-master-2", "https://127.0.0.1:6453"),
                ("skiff-master-3", "https://127.0.0.1:6463"),
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
        assert!(v["contexts"].as_array().unwrap().iter().all(|c| c["context"]["user"] == skiff_pki::ADMIN_USER));
        assert!(v["clusters"].as_array().unwrap().iter().all(|c| c["cluster"]["certificate-authority-data"] == "Q0E="));
        assert_eq!(v["users"][0]["user"]["client-certificate-data"], "Q0VSVA==");
        assert_eq!(v["users"][0]["user"]["client-key-data"], "S0VZ");
    }
}
