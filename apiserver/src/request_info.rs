//! What an HTTP request asks, as Kubernetes' `RequestInfoFactory` reads it
//! from the method, path and query: a verb on a resource (`list pods in
//! default`), or a verb on a path outside the resource API (`get /metrics`).
//! The layers around the handlers use it: path authorization, the audit log
//! and the fairness limits (which let long-running requests through).

/// A request, read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestInfo {
    /// Whether it names a resource (`/api/v1/pods`) rather than a path
    /// (`/api`, `/apis/apps/v1`, `/metrics`).
    pub is_resource: bool,
    /// Kubernetes' verb: get, list, watch, create, update, patch, delete,
    /// deletecollection; for paths, the lowercased method.
    pub verb: String,
    pub api_group: String,
    pub api_version: String,
    pub namespace: String,
    pub resource: String,
    pub name: String,
    pub subresource: String,
    pub path: String,
}

/// Subresources whose requests stay open as long as the client wants.
const LONG_RUNNING_SUBRESOURCES: [&str; 5] = ["attach", "exec", "log", "portforward", "proxy"];

impl RequestInfo {
    pub fn parse(method: &str, path: &str, query: Option<&str>) -> RequestInfo {
        let mut info = RequestInfo { path: path.to_string(), verb: method.to_ascii_lowercase(), ..Default::default() };
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let (group, version, rest) = match segments.as_slice() {
            ["api", v, rest @ ..] if !rest.is_empty() => ("", *v, rest),
            ["apis", g, v, rest @ ..] if !rest.is_empty() => (*g, *v, rest),
            _ => return info,
        };
        info.is_resource = true;
        info.api_group = group.to_string();
        info.api_version = version.to_string();
        let rest: Vec<&str> = match rest {
            // `namespaces/<ns>/<resource>...`; `namespaces/<ns>/status` and
            // `finalize` are the namespace's own subresources.
            ["namespaces", ns, r, tail @ ..] if !matches!(*r, "status" | "finalize") => {
                info.namespace = ns.to_string();
                [&[*r][..], tail].concat()
            }
            ["namespaces", ns, ..] => {
                info.namespace = ns.to_string();
                rest.to_vec()
            }
            other => other.to_vec(),
        };
        if let Some(resource) = rest.first() {
            info.resource = resource.to_string();
        }
        if let Some(name) = rest.get(1) {
            info.name = name.to_string();
        }
        if let Some(sub) = rest.get(2) {
            info.subresource = sub.to_string();
        }
        let watch = query.is_some_and(|q| {
            form_urlencoded::parse(q.as_bytes()).any(|(k, v)| k == "watch" && (v == "true" || v == "1"))
        });
        info.verb = match method {
            "GET" | "HEAD" if watch => "watch",
            "GET" | "HEAD" if info.name.is_empty() => "list",
            "GET" | "HEAD" => "get",
            "POST" => "create",
            "PUT" => "update",
            "PATCH" => "patch",
            "DELETE" if info.name.is_empty() => "deletecollection",
            "DELETE" => "delete",
            other => return RequestInfo { verb: other.to_ascii_lowercase(), ..info },
        }
        .to_string();
        info
    }

    /// Watches and streams (logs, exec, attach, port-forward), which
    /// Kubernetes keeps out of its in-flight limits.
    pub fn is_long_running(&self) -> bool {
        self.verb == "watch" || LONG_RUNNING_SUBRESOURCES.contains(&self.subresource.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(method: &str, uri: &str) -> RequestInfo {
        let (path, query) = match uri.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (uri, None),
        };
        RequestInfo::parse(method, path, query)
    }

    #[test]
    fn requests_read_as_kubernetes_reads_them() {
        for (method, uri, resource, verb, ns, res, name, sub, long) in [
            ("GET", "/api/v1/namespaces/default/pods", true, "list", "default", "pods", "", "", false),
            ("GET", "/api/v1/namespaces/default/pods?watch=true", true, "watch", "default", "pods", "", "", true),
            ("GET", "/api/v1/namespaces/default/pods/web", true, "get", "default", "pods", "web", "", false),
            ("GET", "/api/v1/namespaces/default/pods/web/log", true, "get", "default", "pods", "web", "log", true),
            ("POST", "/api/v1/namespaces/d/pods/web/exec", true, "create", "d", "pods", "web", "exec", true),
            ("POST", "/apis/apps/v1/namespaces/d/deployments", true, "create", "d", "deployments", "", "", false),
            (
                "PUT",
                "/apis/apps/v1/namespaces/d/deployments/x/scale",
                true,
                "update",
                "d",
                "deployments",
                "x",
                "scale",
                false,
            ),
            ("PATCH", "/api/v1/nodes/n1/status", true, "patch", "", "nodes", "n1", "status", false),
            ("DELETE", "/api/v1/namespaces/d/configmaps", true, "deletecollection", "d", "configmaps", "", "", false),
            ("DELETE", "/api/v1/namespaces/d", true, "delete", "d", "namespaces", "d", "", false),
            ("PUT", "/api/v1/namespaces/d/finalize", true, "update", "d", "namespaces", "d", "finalize", false),
            ("GET", "/api/v1/pods", true, "list", "", "pods", "", "", false),
            ("GET", "/api/v1", false, "get", "", "", "", "", false),
            ("GET", "/apis/apps/v1", false, "get", "", "", "", "", false),
            ("GET", "/metrics", false, "get", "", "", "", "", false),
            ("POST", "/healthz", false, "post", "", "", "", "", false),
        ] {
            let info = parse(method, uri);
            assert_eq!(
                (info.is_resource, info.verb.as_str(), info.namespace.as_str(), info.resource.as_str()),
                (resource, verb, ns, res),
                "{method} {uri}"
            );
            assert_eq!((info.name.as_str(), info.subresource.as_str()), (name, sub), "{method} {uri}");
            assert_eq!(info.is_long_running(), long, "{method} {uri}");
        }
        assert_eq!(parse("GET", "/apis/apps/v1/deployments").api_group, "apps");
    }
}
