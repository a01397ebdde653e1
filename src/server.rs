//! `skiff server`: a whole master host in one process, the way k3s users
//! expect: `skiff apiserver`'s flags, optionally read from a YAML file.
//!
//! The config file (`--config FILE`, else [`DEFAULT_CONFIG`] when it
//! exists) maps long flag names to values (`data-dir: /var/lib/skiff`). Its
//! settings are spliced into the command line right after `server`, so
//! clap parses one command line and a flag given there overrides the file
//! (the subcommand lets a later occurrence of a flag replace an earlier
//! one). A list value is joined with commas (`initial-cluster: [1=..,
//! 2=..]`).
//!
//! [`run`] then runs the master's components in this process until shutdown.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use serde_yaml::Value;
use skiff_apiserver::{ApiserverConfig, RunError};
use skiff_controllers::config::ControllerManagerConfig;
use skiff_scheduler::SchedulerConfig;
use skiff_shutdown::Shutdown;

/// The users the components' certificates name, as Kubernetes names them
/// (the bootstrap RBAC policy binds their roles to these users).
pub const CONTROLLER_MANAGER_USER: &str = "system:kube-controller-manager";
pub const SCHEDULER_USER: &str = "system:kube-scheduler";

/// What the in-process controller manager and scheduler present to the
/// client port.
pub struct ComponentCredentials {
    pub controller_manager: skiff_pki::ClientFiles,
    pub scheduler: skiff_pki::ClientFiles,
}

/// The in-process components reach the client port over TLS like any
/// client, so with `--cert-file` they need the CA to trust and, with
/// `--trusted-ca-file`, certificates of their own. As k3s does, they are
/// issued at every start by the CA whose key sits beside the trusted CA file
/// (`ca.key`, where `skiffctl certs ca` puts it), into that directory as
/// `controller-manager-MEMBER` and `scheduler-MEMBER` (the data dir is the
/// store's alone, and is not made before the store opens).
pub fn component_credentials(
    files: &skiff_pki::ServerFiles,
    store: &skiff_raft_store::StoreConfig,
) -> Result<ComponentCredentials, String> {
    use skiff_pki::{Authority, Profile, DEFAULT_VALIDITY};
    let ca_file = files.client_ca.clone().ok_or(
        "with --cert-file, the in-process controller manager and scheduler need --trusted-ca-file (the CA they \
         trust, whose key issues their certificates); or run them apart (--disable-controller-manager, \
         --disable-scheduler)",
    )?;
    let ca_dir = ca_file.parent().unwrap_or(Path::new("."));
    let ca = Authority::load(ca_dir).map_err(|e| {
        format!(
            "the in-process controller manager and scheduler get certificates from the CA beside \
             --trusted-ca-file ({}/ca.crt and ca.key): {e}",
            ca_dir.display()
        )
    })?;
    let dir = ca_dir.to_path_buf();
    let issue = |component: &str, user: &str| -> Result<skiff_pki::ClientFiles, String> {
        let stem = format!("{component}-{}", store.name);
        let profile = Profile::Client { user: user.to_string(), groups: Vec::new() };
        ca.issue(&profile, DEFAULT_VALIDITY)
            .and_then(|c| c.write(&dir, &stem))
            .map_err(|e| format!("issuing the {component}'s certificate: {e}"))?;
        let cert = (dir.join(format!("{stem}.crt")), dir.join(format!("{stem}.key")));
        Ok(skiff_pki::ClientFiles { ca: ca_file.clone(), cert: Some(cert) })
    };
    Ok(ComponentCredentials {
        controller_manager: issue("controller-manager", CONTROLLER_MANAGER_USER)?,
        scheduler: issue("scheduler", SCHEDULER_USER)?,
    })
}

/// The CA beside the client port's `--trusted-ca-file` (its `ca.key` in the
/// same directory), to sign joining nodes' certificates with, if it is there.
pub fn signing_beside(client_tls: Option<&skiff_pki::ServerFiles>) -> Option<skiff_apiserver::config::SigningFiles> {
    let cert = client_tls?.client_ca.clone()?;
    let key = cert.parent().unwrap_or(Path::new(".")).join("ca.key");
    key.exists().then_some(skiff_apiserver::config::SigningFiles { cert, key })
}

/// Where k3s users expect a server's configuration.
pub const DEFAULT_CONFIG: &str = "/etc/skiff/config.yaml";

/// A config file that cannot be used; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config file {path}: not YAML: {reason}")]
    Parse { path: PathBuf, reason: String },
    #[error("config file {path}: expected a mapping of flag names to values")]
    NotAMapping { path: PathBuf },
    #[error("config file {path}: unknown key {key:?} (keys are `skiff server` flags without the dashes: {known})")]
    UnknownKey { path: PathBuf, key: String, known: String },
    #[error("config file {path}: key {key:?}: {reason}")]
    BadValue { path: PathBuf, key: String, reason: String },
}

/// The config file named by `--config FILE` or `--config=FILE` among `args`.
fn config_flag(args: &[OsString]) -> Option<PathBuf> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--" {
            return None;
        }
        if a == "--config" {
            return it.next().map(PathBuf::from);
        }
        if let Some(path) = a.to_str().and_then(|s| s.strip_prefix("--config=")) {
            return Some(PathBuf::from(path));
        }
    }
    None
}

/// `argv` (the whole command line, program name first) with the config
/// file's settings inserted after `server`. Any other command line is
/// returned unchanged. `server` is the subcommand's clap definition: the
/// file may only set its flags.
pub fn argv_with_config(argv: Vec<OsString>, server: &clap::Command) -> Result<Vec<OsString>, ConfigError> {
    if argv.get(1).map(OsString::as_os_str) != Some(OsStr::new("server")) {
        return Ok(argv);
    }
    let path = match config_flag(&argv[2..]) {
        Some(p) => p,
        None if Path::new(DEFAULT_CONFIG).exists() => PathBuf::from(DEFAULT_CONFIG),
        None => return Ok(argv),
    };
    let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read { path: path.clone(), source })?;
    let settings = config_args(&path, &text, server)?;
    let mut out = argv;
    out.splice(2..2, settings);
    Ok(out)
}

/// The flags a config file's `text` stands for, as `--name=value`.
pub fn config_args(path: &Path, text: &str, server: &clap::Command) -> Result<Vec<OsString>, ConfigError> {
    let doc: Value = serde_yaml::from_str(text)
        .map_err(|e| ConfigError::Parse { path: path.to_path_buf(), reason: e.to_string() })?;
    let map = match doc {
        Value::Null => return Ok(Vec::new()),
        Value::Mapping(m) => m,
        _ => return Err(ConfigError::NotAMapping { path: path.to_path_buf() }),
    };
    let settable = |a: &&clap::Arg| a.get_long().is_some_and(|l| !matches!(l, "config" | "help" | "version"));
    let mut out = Vec::new();
    for (key, value) in map {
        let bad = |key: &str, reason: &str| ConfigError::BadValue {
            path: path.to_path_buf(),
            key: key.to_string(),
            reason: reason.to_string(),
        };
        let key = match key {
            Value::String(k) => k,
            other => return Err(bad(&format!("{other:?}"), "keys are flag names")),
        };
        let Some(arg) = server.get_arguments().filter(settable).find(|a| a.get_long() == Some(key.as_str())) else {
            let known: Vec<&str> = server.get_arguments().filter(settable).filter_map(|a| a.get_long()).collect();
            return Err(ConfigError::UnknownKey { path: path.to_path_buf(), key, known: known.join(", ") });
        };
        let value = match value {
            Value::Sequence(items) => {
                let items: Result<Vec<String>, _> = items.iter().map(scalar).collect();
                items.map_err(|r| bad(&key, &r))?.join(",")
            }
            other => scalar(&other).map_err(|r| bad(&key, &r))?,
        };
        if !arg.get_action().takes_values() {
            // A switch: `true` sets it, `false` leaves it off.
            match value.as_str() {
                "true" => out.push(OsString::from(format!("--{key}"))),
                "false" => {}
                _ => return Err(bad(&key, "is a switch: true or false")),
            }
            continue;
        }
        // `--name=value`, so that a value starting with a dash stays a value.
        out.push(OsString::from(format!("--{key}={value}")));
    }
    Ok(out)
}

fn scalar(v: &Value) -> Result<String, String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        Value::Null => Err("has no value".into()),
        _ => Err("must be a string, a number, a boolean or a list of those".into()),
    }
}

/// A component of the master host that failed.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Apiserver(#[from] RunError),
    #[error("controller manager: {0}")]
    ControllerManager(#[from] skiff_controllers::RunError),
    #[error("scheduler: {0}")]
    Scheduler(#[from] skiff_scheduler::RunError),
}

/// Runs a master host's components in this process until `shutdown` is
/// cancelled, and returns once every one of them has stopped: the
/// apiserver, and (unless `None`) a controller manager and a scheduler,
/// each on a child of the same shutdown and talking gRPC to this
/// apiserver, so that one signal stops them all.
pub async fn run(
    config: ApiserverConfig,
    controllers: Option<ControllerManagerConfig>,
    scheduler: Option<SchedulerConfig>,
    shutdown: Shutdown,
) -> Result<(), ServerError> {
    let manager = controllers.map(|c| {
        let child = shutdown.child();
        child.spawn(skiff_controllers::run(c, child.clone()))
    });
    let scheduler = scheduler.map(|c| {
        let child = shutdown.child();
        child.spawn(skiff_scheduler::run(c, child.clone()))
    });
    let served = skiff_apiserver::run(config, shutdown.clone()).await;
    shutdown.cancel();
    // The apiserver's own failure is the one to report first.
    let manager = match manager {
        Some(task) => task.await.ok().and_then(Result::err),
        None => None,
    };
    let scheduler = match scheduler {
        Some(task) => task.await.ok().and_then(Result::err),
        None => None,
    };
    served?;
    if let Some(e) = manager {
        return Err(e.into());
    }
    if let Some(e) = scheduler {
        return Err(e.into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, ArgAction, Command};

    fn server() -> Command {
        Command::new("server")
            .arg(Arg::new("id").long("id"))
            .arg(Arg::new("data_dir").long("data-dir"))
            .arg(Arg::new("initial_cluster").long("initial-cluster"))
            .arg(Arg::new("verbose").long("verbose").action(ArgAction::SetTrue))
            .arg(Arg::new("config").long("config"))
    }

    fn args(text: &str) -> Result<Vec<String>, ConfigError> {
        config_args(Path::new("c.yaml"), text, &server())
            .map(|v| v.into_iter().map(|s| s.into_string().unwrap()).collect())
    }

    #[test]
    fn keys_become_long_flags() {
        let out = args("id: 2\ndata-dir: /var/lib/skiff\ninitial-cluster:\n  - 1=10.0.0.1:2380\n  - 2=10.0.0.2:2380\n")
            .unwrap();
        assert_eq!(out, ["--id=2", "--data-dir=/var/lib/skiff", "--initial-cluster=1=10.0.0.1:2380,2=10.0.0.2:2380"]);
        assert_eq!(args("verbose: true").unwrap(), ["--verbose"]);
        assert!(args("verbose: false").unwrap().is_empty());
        assert!(args("").unwrap().is_empty());
    }

    #[test]
    fn unknown_keys_and_odd_values_are_refused_with_the_file_name() {
        let e = args("data_dir: /x").unwrap_err().to_string();
        assert!(e.starts_with("config file c.yaml: unknown key \"data_dir\""), "{e}");
        assert!(e.contains("data-dir"), "{e}");
        assert!(args("config: other.yaml").is_err());
        assert!(args("id:").unwrap_err().to_string().contains("has no value"));
        assert!(args("id: {a: 1}").is_err());
        assert!(args("verbose: yes please").is_err());
        assert!(args("- id").unwrap_err().to_string().contains("mapping"));
        assert!(args("id: [").unwrap_err().to_string().contains("not YAML"));
    }

    #[test]
    fn the_file_goes_before_the_command_line_so_flags_override_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.yaml");
        std::fs::write(&file, "id: 1\ndata-dir: /from/file\n").unwrap();
        let argv: Vec<OsString> = ["skiff", "server", "--config", file.to_str().unwrap(), "--data-dir", "/from/flag"]
            .into_iter()
            .map(OsString::from)
            .collect();
        let out = argv_with_config(argv, &server()).unwrap();
        assert_eq!(&out[..4], ["skiff", "server", "--id=1", "--data-dir=/from/file"].map(OsString::from));
        assert_eq!(out[6..], ["--data-dir", "/from/flag"].map(OsString::from));
        let other: Vec<OsString> = ["skiff", "apiserver", "--config", "x"].into_iter().map(OsString::from).collect();
        assert_eq!(argv_with_config(other.clone(), &server()).unwrap(), other);
        let missing: Vec<OsString> =
            ["skiff", "server", "--config=/nonexistent.yaml"].into_iter().map(OsString::from).collect();
        assert!(matches!(argv_with_config(missing, &server()), Err(ConfigError::Read { .. })));
    }
}
