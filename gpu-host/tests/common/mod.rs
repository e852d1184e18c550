//! The `serve` fixture the gpu-host's integration tests share: a host
//! started as a user starts it, in a fresh folder, reached with the
//! `bulkhead-protocol` client, killed and cleaned up on drop.

// Each test binary uses part of it.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bulkhead_protocol::v1::gpu_host_client::GpuHostClient;
use bulkhead_protocol::{Target, connect};
use tonic::transport::Channel;

/// How long a host may take to load its models and listen.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A running `serve`.
pub struct Host {
    pub child: Child,
    pub dir: PathBuf,
    pub target: Target,
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_bulkhead-gpu-host"))
}

/// A fixture model's path (`tests/fixtures/models/NAME`).
pub fn model(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/models")
        .join(name)
        .display()
        .to_string()
}

/// A fresh, empty folder for test `name` of this test binary.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "bulkhead-{}-{name}-{}",
        env!("CARGO_CRATE_NAME"),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `serve` on a Unix socket in a fresh folder, with `args` (models,
/// threads, limits).
pub fn start_unix<S: AsRef<std::ffi::OsStr>>(name: &str, args: &[S]) -> Host {
    let dir = temp_dir(name);
    let socket = dir.join("host.sock");
    let child = bin()
        .arg("serve")
        .arg("--listen")
        .arg(format!("unix:{}", socket.display()))
        .args(args)
        .stdout(Stdio::null())
        .spawn()
        .expect("binary starts");
    Host {
        child,
        dir,
        target: Target::Unix(socket),
    }
}

impl Host {
    /// Connects, retrying (bounded) until the host listens.
    pub async fn client(&mut self) -> GpuHostClient<Channel> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match connect(&self.target).await {
                Ok(channel) => return GpuHostClient::new(channel),
                Err(e) => {
                    if let Some(status) = self.child.try_wait().unwrap() {
                        panic!("host exited with {status} before listening");
                    }
                    assert!(Instant::now() < deadline, "host not ready: {e}");
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
            }
        }
    }
}
