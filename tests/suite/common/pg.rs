//! A PostgreSQL of the test's own: in, Debian's `postgresql` package (its newest server under
//! /usr/lib/postgresql; scripts/test.sh installs it where missing); out, a cluster made with
//! initdb in a temporary folder, run on a free loopback port (as the `postgres` user when the
//! tests run as root, which initdb refuses), its URL, and its removal when dropped.

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Postgres {
    _dir: tempfile::TempDir,
    data: PathBuf,
    bin: PathBuf,
    pub port: u16,
}

/// The newest server's programs of Debian's package, else those on PATH.
fn bin_dir() -> PathBuf {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| {
            d.flatten()
                .filter_map(|e| {
                    let v = e.file_name().to_string_lossy().parse::<u32>().ok()?;
                    let bin = e.path().join("bin");
                    bin.join("initdb").is_file().then_some((v, bin))
                })
                .collect()
        })
        .unwrap_or_default();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return bin;
    }
    let which = Command::new("sh").args(["-c", "command -v initdb"]).output();
    match which {
        Ok(o) if o.status.success() => PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())
            .parent()
            .unwrap()
            .to_path_buf(),
        _ => {
            panic!("no PostgreSQL server programs (initdb): install Debian's postgresql package (scripts/test.sh does)")
        }
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid reads the process's effective user id and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// `prog` of the server's programs with `args`, to run as the `postgres` user when root.
fn command(bin: &Path, prog: &str, args: &[&str]) -> Command {
    let exe = bin.join(prog);
    let mut c = if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(exe);
        c
    } else {
        Command::new(exe)
    };
    c.args(args);
    c
}

/// Runs `prog` (see [`command`]), which must succeed.
fn run(bin: &Path, prog: &str, args: &[&str]) {
    let out = command(bin, prog, args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {prog}: {e}"));
    assert!(
        out.status.success(),
        "{prog} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Postgres {
    /// A new cluster, running and answering on loopback.
    pub fn start() -> Postgres {
        let bin = bin_dir();
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        if is_root() {
            // The server runs as postgres: its folder is its own, and the way to it open.
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
            let st = Command::new("chown")
                .args(["postgres:postgres", data.to_str().unwrap()])
                .status()
                .unwrap();
            assert!(st.success(), "cannot give the cluster's folder to the postgres user");
        }
        let d = data.to_str().unwrap();
        run(
            &bin,
            "initdb",
            &["-D", d, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"],
        );
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let opts = format!("-p {port} -k {d} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=100");
        let log = format!("{d}/server.log");
        run(
            &bin,
            "pg_ctl",
            &["-D", d, "-o", &opts, "-l", &log, "-w", "-t", "60", "start"],
        );
        Postgres {
            _dir: dir,
            data,
            bin,
            port,
        }
    }

    /// The cluster's own database, as `--jobs-db` takes it.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// A connection of the test's own (to look at the rows, or change them).
    pub fn client(&self) -> ::postgres::Client {
        ::postgres::Client::connect(&self.url(), ::postgres::NoTls).unwrap()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let d = self.data.to_str().unwrap().to_string();
        let _ = command(&self.bin, "pg_ctl", &["-D", &d, "-m", "immediate", "-w", "stop"]).output();
    }
}
