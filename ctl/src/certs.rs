//! `skiffctl certs`: the cluster's certificate authority and the
//! certificates it issues, in a kubeadm-style PKI directory (`ca.crt`,
//! `ca.key`, `<name>.crt`, `<name>.key`).
//!
//! - `certs ca --dir D`: a new authority in D (an existing one is kept).
//! - `certs server --dir D --name apiserver --host 10.0.0.1 --host m1`:
//!   a serving certificate for the apiservers' HTTPS listener.
//! - `certs client --dir D --name alice --user alice --group dev`: a
//!   client certificate (CN = user, O = group), and with `--kubeconfig F
//!   --server https://HOST:PORT` a kubeconfig that uses it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Subcommand};
use skiff_pki::{Authority, Profile};

#[derive(Subcommand)]
pub enum CertsCommand {
    /// Create the cluster's certificate authority (kept if present).
    Ca {
        #[command(flatten)]
        dir: DirArgs,
    },
    /// Issue a serving certificate for the apiservers' HTTPS listener.
    Server {
        #[command(flatten)]
        dir: DirArgs,
        /// Files are `<name>.crt` and `<name>.key`.
        #[arg(long, default_value = "apiserver")]
        name: String,
        /// A DNS name or IP address clients reach the listener at (repeat).
        #[arg(long = "host", required = true)]
        hosts: Vec<String>,
        #[command(flatten)]
        validity: Validity,
    },
    /// Issue a Raft peer's certificate (in group system:skiff-peers), which
    /// a master serves its peer listener with and presents to the others
    /// (`skiff apiserver --peer-cert-file`).
    Peer {
        #[command(flatten)]
        dir: DirArgs,
        /// The member's name (the certificate's common name); files are
        /// `peer-<name>.crt` and `peer-<name>.key`.
        #[arg(long)]
        name: String,
        /// A DNS name or IP address the other members reach it at (repeat).
        #[arg(long = "host", required = true)]
        hosts: Vec<String>,
        #[command(flatten)]
        validity: Validity,
    },
    /// Issue a client certificate: CN = the user, O = the group.
    Client {
        #[command(flatten)]
        dir: DirArgs,
        /// Files are `<name>.crt` and `<name>.key` (default: the user).
        #[arg(long)]
        name: Option<String>,
        #[arg(long)]
        user: String,
        /// The user's group (at most one; `system:masters` may do anything).
        #[arg(long)]
        group: Option<String>,
        #[command(flatten)]
        validity: Validity,
        /// Also write a kubeconfig for this user here.
        #[arg(long, requires = "server_url")]
        kubeconfig: Option<PathBuf>,
        /// The HTTPS address the kubeconfig points at.
        #[arg(long = "server-url")]
        server_url: Option<String>,
    },
}

#[derive(Args)]
pub struct DirArgs {
    /// The PKI directory.
    #[arg(long)]
    pub dir: PathBuf,
}

#[derive(Args)]
pub struct Validity {
    /// How long the certificate is valid (e.g. `8760h`, `30d`).
    #[arg(long, default_value = "8760h", value_parser = humantime::parse_duration)]
    pub valid_for: Duration,
}

fn authority(dir: &Path) -> Result<Authority, String> {
    Authority::load(dir)
        .map_err(|e| format!("{e} (create the authority first: skiffctl certs ca --dir {})", dir.display()))
}

pub fn run(command: CertsCommand) -> Result<(), String> {
    match command {
        CertsCommand::Ca { dir } => {
            let existed = dir.dir.join("ca.crt").exists();
            Authority::load_or_create(&dir.dir, "skiff-ca").map_err(|e| e.to_string())?;
            let verb = if existed { "kept the existing" } else { "created a new" };
            println!("{verb} certificate authority in {}", dir.dir.display());
        }
        CertsCommand::Server { dir, name, hosts, validity } => {
            let issued = authority(&dir.dir)?
                .issue(&Profile::Server { names: hosts }, validity.valid_for)
                .map_err(|e| e.to_string())?;
            issued.write(&dir.dir, &name).map_err(|e| e.to_string())?;
            println!("wrote {name}.crt and {name}.key in {}", dir.dir.display());
        }
        CertsCommand::Peer { dir, name, hosts, validity } => {
            let issued = authority(&dir.dir)?
                .issue(&Profile::Peer { user: name.clone(), names: hosts }, validity.valid_for)
                .map_err(|e| e.to_string())?;
            let stem = format!("peer-{name}");
            issued.write(&dir.dir, &stem).map_err(|e| e.to_string())?;
            println!("wrote {stem}.crt and {stem}.key in {}", dir.dir.display());
        }
        CertsCommand::Client { dir, name, user, group, validity, kubeconfig, server_url } => {
            let ca = authority(&dir.dir)?;
            let profile = Profile::Client { user: user.clone(), groups: group.into_iter().collect() };
            let issued = ca.issue(&profile, validity.valid_for).map_err(|e| e.to_string())?;
            let name = name.unwrap_or_else(|| user.replace(':', "-"));
            issued.write(&dir.dir, &name).map_err(|e| e.to_string())?;
            println!("wrote {name}.crt and {name}.key in {}", dir.dir.display());
            if let (Some(path), Some(server)) = (kubeconfig, server_url) {
                let text = skiff_pki::kubeconfig(&server, ca.cert_pem(), &user, &issued);
                std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
                println!("wrote a kubeconfig for {user} to {}", path.display());
            }
        }
    }
    Ok(())
}
