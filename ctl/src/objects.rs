//! `skiffctl`'s Kubernetes object commands: get, apply, delete, watch,
//! history and diff, over the gRPC resource API. Output reads like
//! kubectl's: tables with the server's columns, YAML or JSON on request,
//! and errors as the Kubernetes `Status` message.

use std::io::Read;

use clap::{Args, ValueEnum};
use futures::StreamExt;
use serde_json::{json, Value};
use skiff_api::resources::{self, ResourceInfo};
use skiff_api::table::{self, IncludeObject, RenderOptions};
use skiff_api::{history, meta, Reason};
use skiff_client::resources::{DeleteParams, EventType, ListParams, WatchParams};
use skiff_client::{Client, ClientError};

/// kubectl's annotation for client-side apply.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Wide,
    Yaml,
    Json,
    Name,
}

#[derive(Args)]
pub struct Scope {
    /// Namespace (default: "default").
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
}

impl Scope {
    fn namespace(&self) -> String {
        if self.all_namespaces {
            String::new()
        } else {
            self.namespace.clone().unwrap_or_else(|| "default".into())
        }
    }
}

/// Which objects of a type: kubectl's `-l` and `--field-selector`.
#[derive(Args)]
pub struct Selectors {
    /// Label selector (`app=web,tier!=db`).
    #[arg(short = 'l', long)]
    pub selector: Option<String>,
    /// Field selector (`spec.nodeName=node-1`).
    #[arg(long)]
    pub field_selector: Option<String>,
}

#[derive(Args)]
pub struct GetArgs {
    /// Resource type (`pods`, `po`, `deployments.apps`), or TYPE/NAME.
    pub resource: String,
    /// Object names (all when none).
    pub names: Vec<String>,
    #[command(flatten)]
    pub scope: Scope,
    #[command(flatten)]
    pub selectors: Selectors,
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<Output>,
    /// The object as it was at this revision (shown as YAML by default).
    #[arg(long)]
    pub revision: Option<i64>,
    #[arg(long)]
    pub show_labels: bool,
    #[arg(long)]
    pub no_headers: bool,
}

#[derive(Args)]
pub struct ApplyArgs {
    /// Manifest file (YAML, multi-document, or JSON); `-` for stdin.
    #[arg(short = 'f', long = "filename", required = true)]
    pub files: Vec<String>,
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Cascade {
    Background,
    Foreground,
    Orphan,
}

#[derive(Args)]
pub struct DeleteArgs {
    /// Resource type, or TYPE/NAME; omit with -f.
    pub resource: Option<String>,
    pub names: Vec<String>,
    #[arg(short = 'f', long = "filename")]
    pub files: Vec<String>,
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    #[arg(long, value_enum, default_value = "background")]
    pub cascade: Cascade,
    /// Seconds the object's owner gets to clean up (pods on nodes).
    #[arg(long)]
    pub grace_period: Option<i64>,
    /// Delete immediately (grace period 0... as `--grace-period=1` in kubectl).
    #[arg(long)]
    pub now: bool,
    /// Do not fail when the object does not exist.
    #[arg(long)]
    pub ignore_not_found: bool,
}

#[derive(Args)]
pub struct WatchArgs {
    pub resource: String,
    /// Watch just this object.
    pub name: Option<String>,
    #[command(flatten)]
    pub scope: Scope,
    #[command(flatten)]
    pub selectors: Selectors,
    /// Start after this revision; by default the current objects come first.
    #[arg(long)]
    pub resource_version: Option<String>,
    /// One JSON event per line (`{"type":..,"object":..}`).
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<Output>,
    /// Stop after this many events.
    #[arg(long)]
    pub max_events: Option<usize>,
}

#[derive(Args)]
pub struct HistoryArgs {
    /// TYPE/NAME or TYPE.
    pub resource: String,
    pub name: Option<String>,
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<Output>,
}

#[derive(Args)]
pub struct DiffArgs {
    /// TYPE/NAME or TYPE.
    pub resource: String,
    pub name: Option<String>,
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    #[arg(long)]
    pub from: i64,
    /// Default: the current version.
    #[arg(long)]
    pub to: Option<i64>,
}

fn error(e: ClientError) -> String {
    match e {
        ClientError::Api(e) => format!("Error from server ({:?}): {}", e.reason, e.message),
        other => other.to_string(),
    }
}

fn resource(name: &str) -> Result<&'static ResourceInfo, String> {
    resources::lookup(name).ok_or_else(|| format!("the server doesn't have a resource type \"{name}\""))
}

/// `pods web` or `pods/web` → the resource and its names.
fn split_target(resource: &str, names: &[String]) -> Result<(&'static ResourceInfo, Vec<String>), String> {
    match resource.split_once('/') {
        Some((r, n)) => {
            if !names.is_empty() {
                return Err(
                    "there is no need to specify a resource type as a separate argument when passing TYPE/NAME".into(),
                );
            }
            Ok((self::resource(r)?, vec![n.to_string()]))
        }
        None => Ok((self::resource(resource)?, names.to_vec())),
    }
}

fn one_name(resource: &str, name: &Option<String>) -> Result<(&'static ResourceInfo, String), String> {
    let names: Vec<String> = name.iter().cloned().collect();
    let (info, names) = split_target(resource, &names)?;
    match names.as_slice() {
        [n] => Ok((info, n.clone())),
        _ => Err("exactly one object name is required (TYPE/NAME or TYPE NAME)".into()),
    }
}

fn print_object(obj: &Value, output: Output) {
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(obj).expect("JSON values serialize")),
        _ => print!("{}", history::to_yaml(obj)),
    }
}

fn kind_name(info: &ResourceInfo, name: &str) -> String {
    let group = if info.group.is_empty() { String::new() } else { format!(".{}", info.group) };
    format!("{}{group}/{name}", info.singular)
}

pub async fn get(client: &Client, args: GetArgs) -> Result<(), String> {
    let (info, names) = split_target(&args.resource, &args.names)?;
    let ns = args.scope.namespace();
    let options = RenderOptions {
        wide: args.output == Some(Output::Wide),
        namespace_column: args.scope.all_namespaces && info.namespaced,
        no_headers: args.no_headers,
        show_labels: args.show_labels,
    };
    if let Some(revision) = args.revision {
        let [name] = names.as_slice() else {
            return Err("--revision needs exactly one object name".into());
        };
        let obj = client.get_at_revision(info, &ns, name, revision).await.map_err(error)?;
        match args.output {
            None | Some(Output::Yaml) => print_object(&obj, Output::Yaml),
            Some(Output::Json) => print_object(&obj, Output::Json),
            Some(Output::Name) => println!("{}", kind_name(info, name)),
            Some(Output::Wide) => print!(
                "{}",
                table::render(&table::table(info, &[obj], IncludeObject::Metadata, chrono::Utc::now()), options)
            ),
        }
        return Ok(());
    }
    let objects: Vec<Value> = if names.is_empty() {
        let params = ListParams {
            label_selector: args.selectors.selector.clone().unwrap_or_default(),
            field_selector: args.selectors.field_selector.clone().unwrap_or_default(),
            ..Default::default()
        };
        if matches!(args.output, None | Some(Output::Wide)) {
            let t = client.list_table(info, &ns, &params).await.map_err(error)?;
            if t["rows"].as_array().is_none_or(|r| r.is_empty()) {
                no_resources(info, &ns);
            } else {
                print!("{}", table::render(&t, options));
            }
            return Ok(());
        }
        client.list_all(info, &ns, &params).await.map_err(error)?.items
    } else {
        let mut found = Vec::new();
        let mut failed = None;
        for n in &names {
            match client.get(info, &ns, n).await {
                Ok(o) => found.push(o),
                Err(e) => {
                    eprintln!("{}", error(e.clone()));
                    failed = Some(e);
                }
            }
        }
        if found.is_empty() {
            if let Some(e) = failed {
                return Err(error(e));
            }
        }
        found
    };
    match args.output {
        None | Some(Output::Wide) => {
            let t = table::table(info, &objects, IncludeObject::Metadata, chrono::Utc::now());
            print!("{}", table::render(&t, options));
        }
        Some(Output::Name) => {
            objects.iter().for_each(|o| println!("{}", kind_name(info, meta::name(o).unwrap_or_default())))
        }
        Some(out) => {
            if names.len() == 1 && objects.len() == 1 {
                print_object(&objects[0], out);
            } else {
                print_object(
                    &json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": objects}),
                    out,
                );
            }
        }
    }
    Ok(())
}

fn no_resources(info: &ResourceInfo, ns: &str) {
    if info.namespaced && !ns.is_empty() {
        eprintln!("No resources found in {ns} namespace.");
    } else {
        eprintln!("No resources found");
    }
}

/// The documents of manifest files: YAML (several per file), JSON, and
/// `List` kinds flattened.
pub fn read_manifests(files: &[String]) -> Result<Vec<Value>, String> {
    let mut docs = Vec::new();
    for f in files {
        let text = if f == "-" {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s).map_err(|e| format!("cannot read stdin: {e}"))?;
            s
        } else {
            std::fs::read_to_string(f).map_err(|e| format!("cannot read {f}: {e}"))?
        };
        for (i, doc) in serde_yaml::Deserializer::from_str(&text).enumerate() {
            let v: Value = serde::Deserialize::deserialize(doc)
                .map_err(|e| format!("error parsing {f} (document {}): {e}", i + 1))?;
            match v {
                Value::Null => {}
                Value::Object(_)
                    if v["kind"].as_str().is_some_and(|k| k.ends_with("List")) && v["items"].is_array() =>
                {
                    docs.extend(v["items"].as_array().cloned().unwrap_or_default());
                }
                Value::Object(_) => docs.push(v),
                other => return Err(format!("error parsing {f} (document {}): not an object: {other}", i + 1)),
            }
        }
    }
    Ok(docs)
}

fn info_of(doc: &Value) -> Result<&'static ResourceInfo, String> {
    let api_version = doc["apiVersion"].as_str().unwrap_or_default();
    let kind = doc["kind"].as_str().unwrap_or_default();
    if api_version.is_empty() || kind.is_empty() {
        return Err("error validating data: apiVersion and kind must be set".into());
    }
    resources::by_kind(api_version, kind).ok_or_else(|| {
        format!(
            "resource mapping not found for name: {:?}: no matches for kind \"{kind}\" in version \"{api_version}\"",
            meta::name(doc).unwrap_or_default()
        )
    })
}

/// Whether `current` already says everything `wanted` says: every field of
/// `wanted` is in `current` with the same value, lists element by element.
/// Fields the server filled in (defaults) do not count as a difference.
fn covers(current: &Value, wanted: &Value) -> bool {
    match (current, wanted) {
        (Value::Object(c), Value::Object(w)) => w.iter().all(|(k, wv)| match c.get(k) {
            Some(cv) => covers(cv, wv),
            None => says_nothing(wv),
        }),
        (Value::Array(c), Value::Array(w)) => c.len() == w.len() && c.iter().zip(w).all(|(cv, wv)| covers(cv, wv)),
        _ => current == wanted,
    }
}

/// `{}`, `[]` or null: a field the server drops or never stores.
fn says_nothing(v: &Value) -> bool {
    v.is_null() || v.as_object().is_some_and(|o| o.is_empty()) || v.as_array().is_some_and(|a| a.is_empty())
}

/// Client-side apply's three-way merge patch: fields the last applied
/// manifest (`original`) had and the new one (`modified`) dropped are
/// deleted (null); fields the new manifest sets that the live object
/// (`current`) does not already say are set. Lists are replaced whole (a
/// JSON merge patch has no list keys).
pub fn three_way_patch(original: &Value, modified: &Value, current: &Value) -> Value {
    let mut patch = serde_json::Map::new();
    let (Some(m), Some(c)) = (modified.as_object(), current.as_object()) else {
        return modified.clone();
    };
    if let Some(o) = original.as_object() {
        for k in o.keys() {
            if !m.contains_key(k) && c.contains_key(k) {
                patch.insert(k.clone(), Value::Null);
            }
        }
    }
    for (k, mv) in m {
        let ov = original.get(k).unwrap_or(&Value::Null);
        match c.get(k) {
            Some(cv) if cv.is_object() && mv.is_object() => {
                let sub = three_way_patch(ov, mv, cv);
                if sub.as_object().is_some_and(|s| !s.is_empty()) {
                    patch.insert(k.clone(), sub);
                }
            }
            Some(cv) if covers(cv, mv) => {}
            None if says_nothing(mv) => {}
            _ => {
                patch.insert(k.clone(), mv.clone());
            }
        }
    }
    Value::Object(patch)
}

pub async fn apply(client: &Client, args: ApplyArgs) -> Result<(), String> {
    let docs = read_manifests(&args.files)?;
    let mut failures = 0;
    for mut doc in docs {
        let info = match info_of(&doc) {
            Ok(i) => i,
            Err(e) => {
                eprintln!("error: {e}");
                failures += 1;
                continue;
            }
        };
        let ns = if info.namespaced {
            meta::namespace(&doc).map(str::to_string).or(args.namespace.clone()).unwrap_or_else(|| "default".into())
        } else {
            String::new()
        };
        let Some(name) = meta::name(&doc).map(str::to_string) else {
            eprintln!("error: {} has no metadata.name", info.kind);
            failures += 1;
            continue;
        };
        // Record the manifest as applied, as kubectl does.
        let applied = serde_json::to_string(&doc).expect("JSON values serialize");
        let annotations = meta::meta_mut(&mut doc).entry("annotations").or_insert_with(|| json!({}));
        if let Some(a) = annotations.as_object_mut() {
            a.insert(LAST_APPLIED.into(), json!(applied));
        }
        let result = match client.get(info, &ns, &name).await {
            Err(e) if e.is(Reason::NotFound) => client.create(info, &ns, &doc).await.map(|_| "created"),
            Err(e) => Err(e),
            Ok(live) => {
                let original: Value = meta::annotations(&live)
                    .get(LAST_APPLIED)
                    .and_then(|s| serde_json::from_str(s).ok())
                    .unwrap_or(json!({}));
                let mut patch = three_way_patch(&original, &doc, &live);
                if patch.as_object().is_some_and(|p| p.is_empty()) {
                    Ok("unchanged")
                } else {
                    // Conditional on the version read: a concurrent writer makes this a Conflict.
                    patch["metadata"]["resourceVersion"] = json!(meta::resource_version(&live));
                    client.patch(info, &ns, &name, "merge", &patch, "").await.map(|_| "configured")
                }
            }
        };
        match result {
            Ok(what) => println!("{} {what}", kind_name(info, &name)),
            Err(e) => {
                eprintln!("{}", error(e));
                failures += 1;
            }
        }
    }
    if failures > 0 {
        return Err(format!("{failures} object(s) could not be applied"));
    }
    Ok(())
}

pub async fn delete(client: &Client, args: DeleteArgs) -> Result<(), String> {
    let mut targets: Vec<(&'static ResourceInfo, String, String)> = Vec::new();
    let default_ns = args.namespace.clone().unwrap_or_else(|| "default".into());
    if !args.files.is_empty() {
        for doc in read_manifests(&args.files)? {
            let info = info_of(&doc)?;
            let name = meta::name(&doc).ok_or("a manifest has no metadata.name")?.to_string();
            let ns = meta::namespace(&doc).map(str::to_string).unwrap_or_else(|| default_ns.clone());
            targets.push((info, ns, name));
        }
    } else {
        let resource = args.resource.as_deref().ok_or("a resource type and name, or -f, is required")?;
        let (info, names) = split_target(resource, &args.names)?;
        if names.is_empty() {
            return Err("resource(s) were provided, but no name was specified".into());
        }
        targets.extend(names.into_iter().map(|n| (info, default_ns.clone(), n)));
    }
    let params = DeleteParams {
        propagation_policy: match args.cascade {
            Cascade::Background => "Background",
            Cascade::Foreground => "Foreground",
            Cascade::Orphan => "Orphan",
        }
        .into(),
        grace_period_seconds: if args.now { Some(1) } else { args.grace_period },
        ..Default::default()
    };
    let mut failures = 0;
    for (info, ns, name) in targets {
        match client.delete(info, &ns, &name, &params).await {
            Ok(_) => println!("{} \"{name}\" deleted", info.singular),
            Err(e) if args.ignore_not_found && e.is(Reason::NotFound) => {}
            Err(e) => {
                eprintln!("{}", error(e));
                failures += 1;
            }
        }
    }
    if failures > 0 {
        return Err(format!("{failures} object(s) could not be deleted"));
    }
    Ok(())
}

/// Follows a resource, reconnecting (to any master) from the last
/// resourceVersion seen whenever the stream breaks.
pub async fn watch(client: &Client, args: WatchArgs) -> Result<(), String> {
    let info = resource(&args.resource)?;
    let ns = args.scope.namespace();
    let mut params = WatchParams {
        label_selector: args.selectors.selector.clone().unwrap_or_default(),
        field_selector: args.selectors.field_selector.clone().unwrap_or_default(),
        resource_version: args.resource_version.clone().unwrap_or_default(),
        allow_bookmarks: true,
        name: args.name.clone().unwrap_or_default(),
        ..Default::default()
    };
    let mut seen = 0usize;
    let mut retries = 0u32;
    loop {
        let mut stream = match client.watch(info, &ns, &params).await {
            Ok(s) => s,
            Err(e)
                if retries < 30
                    && !matches!(
                        e.reason(),
                        Some(Reason::BadRequest | Reason::NotFound | Reason::Expired | Reason::Gone)
                    ) =>
            {
                retries += 1;
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                continue;
            }
            Err(e) => return Err(error(e)),
        };
        while let Some(event) = stream.next().await {
            let event = match event {
                Ok(e) => e,
                Err(e) => {
                    tracing::debug!(error = %e, "watch broke; resuming");
                    break;
                }
            };
            retries = 0;
            if let Some(rv) = event.resource_version() {
                params.resource_version = rv.to_string();
            }
            match event.kind {
                EventType::Bookmark => continue,
                EventType::Error => {
                    let e = skiff_api::ApiError::from_status(&event.object);
                    match e {
                        Some(e) if matches!(e.reason, Reason::Expired | Reason::Gone) => {
                            return Err(format!("watch expired: {}", e.message))
                        }
                        _ => break,
                    }
                }
                _ => {}
            }
            match args.output {
                Some(Output::Json) => println!("{}", json!({"type": event.kind.as_str(), "object": event.object})),
                Some(Output::Yaml) => {
                    print!("---\ntype: {}\n{}", event.kind, history::to_yaml(&json!({"object": event.object})))
                }
                _ => {
                    let name = meta::name(&event.object).unwrap_or_default();
                    let ns = meta::namespace(&event.object).map(|n| format!("{n}/")).unwrap_or_default();
                    println!(
                        "{:<9} {}{} rv={}",
                        event.kind,
                        ns,
                        kind_name(info, name),
                        event.resource_version().unwrap_or("")
                    );
                }
            }
            seen += 1;
            if args.max_events.is_some_and(|m| seen >= m) {
                return Ok(());
            }
        }
        if params.resource_version.is_empty() {
            params.resource_version = "0".into();
        }
    }
}

pub async fn history_cmd(client: &Client, args: HistoryArgs) -> Result<(), String> {
    let (info, name) = one_name(&args.resource, &args.name)?;
    let ns = args.namespace.clone().unwrap_or_else(|| "default".into());
    let h = client.history(info, &ns, &name).await.map_err(error)?;
    if let Some(out @ (Output::Json | Output::Yaml)) = args.output {
        let entries: Vec<Value> = h
            .entries
            .iter()
            .map(|e| {
                json!({"revision": e.revision, "type": e.r#type, "commitTime": time(e.commit_time_ms),
                    "summary": e.summary, "object": serde_json::from_slice::<Value>(&e.object).unwrap_or(Value::Null)})
            })
            .collect();
        print_object(&json!({"compactedRevision": h.compacted_revision, "entries": entries}), out);
        return Ok(());
    }
    let rows: Vec<[String; 4]> = h
        .entries
        .iter()
        .map(|e| [e.revision.to_string(), e.r#type.clone(), time(e.commit_time_ms), e.summary.clone()])
        .collect();
    let mut widths = [8usize, 5, 4, 7];
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    println!(
        "{:<w0$}   {:<w1$}   {:<w2$}   SUMMARY",
        "REVISION",
        "EVENT",
        "TIME",
        w0 = widths[0],
        w1 = widths[1],
        w2 = widths[2]
    );
    for r in rows {
        println!(
            "{:<w0$}   {:<w1$}   {:<w2$}   {}",
            r[0],
            r[1],
            r[2],
            r[3],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2]
        );
    }
    if h.compacted_revision > 0 {
        eprintln!("(history before revision {} was compacted)", h.compacted_revision);
    }
    Ok(())
}

fn time(ms: u64) -> String {
    chrono::DateTime::from_timestamp_millis(ms as i64)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_else(|| "-".into())
}

pub async fn diff(client: &Client, args: DiffArgs) -> Result<(), String> {
    let (info, name) = one_name(&args.resource, &args.name)?;
    let ns = args.namespace.clone().unwrap_or_else(|| "default".into());
    let from = client.get_at_revision(info, &ns, &name, args.from).await.map_err(error)?;
    let (to, to_label) = match args.to {
        Some(r) => (client.get_at_revision(info, &ns, &name, r).await.map_err(error)?, format!("revision {r}")),
        None => (client.get(info, &ns, &name).await.map_err(error)?, "current".to_string()),
    };
    let strip = |mut v: Value| {
        if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("resourceVersion");
        }
        v
    };
    let out = history::unified_diff(
        &strip(from),
        &strip(to),
        &format!("{}/{name} revision {}", info.singular, args.from),
        &format!("{}/{name} {to_label}", info.singular),
    );
    print!("{out}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_ignores_server_defaults_and_deletes_what_the_manifest_dropped() {
        let original = json!({"data": {"a": "1", "b": "2"}, "spec": {"containers": [{"name": "c", "image": "x:1"}]}});
        let modified = json!({"data": {"a": "1"}, "spec": {"containers": [{"name": "c", "image": "x:1"}]}});
        let current = json!({"data": {"a": "1", "b": "2"}, "spec": {"containers": [
            {"name": "c", "image": "x:1", "imagePullPolicy": "IfNotPresent"}], "dnsPolicy": "ClusterFirst"}});
        assert_eq!(three_way_patch(&original, &modified, &current), json!({"data": {"b": null}}));
        let unchanged = three_way_patch(
            &modified,
            &modified,
            &json!({"data": {"a": "1"},
            "spec": {"containers": [{"name": "c", "image": "x:1", "imagePullPolicy": "IfNotPresent"}]}}),
        );
        assert_eq!(unchanged, json!({}));
        let newer = json!({"data": {"a": "1"}, "spec": {"containers": [{"name": "c", "image": "x:2"}]}});
        assert_eq!(
            three_way_patch(&modified, &newer, &current)["spec"]["containers"],
            json!([{"name": "c", "image": "x:2"}])
        );
    }
}
