//! The embedded default: a `bulkhead-gpu-host serve` child on a private Unix
//! socket, restarted with exponential backoff whenever it exits.
//!
//! The child holds our end of a pipe on its stdin and exits gracefully when
//! it closes (`--exit-with-parent`), so it never outlives the gateway, even
//! one killed with SIGKILL.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use bulkhead_partition::Device;
use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::UpstreamState;

/// `[local_gpu_host]` with defaults applied and paths resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalGpuHost {
    /// `None`: `bulkhead-gpu-host` next to the running `bulkhead` binary.
    pub binary: Option<PathBuf>,
    /// `None`: all cores.
    pub threads: Option<usize>,
    pub workers: usize,
    pub queue_capacity: usize,
    pub restart_backoff_max: Duration,
    /// `None`: the gpu-host's default scrub rate.
    pub scrub_bytes_per_s: Option<u64>,
    /// `None`: the gpu-host's default floor (an eighth of the rate).
    pub scrub_min_bytes_per_s: Option<u64>,
    /// The device tenants' `[gpu]` tables are planned on.
    pub device: Device,
    /// Memory of `device` set aside for model weights.
    pub model_reservation_bytes: u64,
}

impl LocalGpuHost {
    /// The child's `--kv-memory`: the `cpu` device's memory less the model
    /// reservation, the same KV memory `policy check` planned the tenants
    /// with. `None` for a GPU device, whose memory the child reads itself.
    pub fn kv_memory_bytes(&self) -> Option<u64> {
        (self.device.xcds.is_none() && self.device.name == "cpu").then(|| {
            self.device
                .memory_bytes
                .saturating_sub(self.model_reservation_bytes)
        })
    }
}

/// First wait before restarting a child that exited.
const INITIAL_BACKOFF: Duration = Duration::from_millis(100);
/// A child that stayed up this long had a real crash, not a crash loop:
/// the next restart starts again from `INITIAL_BACKOFF`.
const HEALTHY_UPTIME: Duration = Duration::from_secs(30);
/// How long a child may take to drain after its stdin closes before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// What the child runs.
#[derive(Clone, Debug)]
pub struct ChildConfig {
    pub binary: PathBuf,
    pub socket: PathBuf,
    pub host: LocalGpuHost,
    /// Its log format and trace export (the gateway's, under its own
    /// `service.name`).
    pub telemetry: ChildTelemetry,
}

/// What the child logs and exports like.
#[derive(Clone, Debug, Default)]
pub struct ChildTelemetry {
    pub log_format: bulkhead_telemetry::LogFormat,
    /// `OTEL_*` variables set on the child (empty: it inherits the
    /// gateway's environment, which then configures no export).
    pub env: Vec<(&'static str, String)>,
}

impl ChildTelemetry {
    /// The child of a gateway with `settings` and `log_format`.
    pub fn of(
        settings: Option<&bulkhead_telemetry::Settings>,
        log_format: bulkhead_telemetry::LogFormat,
    ) -> ChildTelemetry {
        ChildTelemetry {
            log_format,
            env: settings.map_or_else(Vec::new, |s| s.child_env(CHILD_SERVICE_NAME)),
        }
    }
}

/// The child's `service.name`.
pub const CHILD_SERVICE_NAME: &str = "bulkhead-gpu-host";

/// Why the supervisor could not start.
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error(
        "cannot find `bulkhead-gpu-host` next to {}; build it (`cargo build --release -p bulkhead-gpu-host`) or set `local_gpu_host.binary` in gateway.toml",
        .0.display()
    )]
    BinaryNotFound(PathBuf),
    #[error("creating the socket folder {}: {source}", path.display())]
    SocketDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("locating the running executable: {0}")]
    CurrentExe(std::io::Error),
}

impl ChildConfig {
    /// Resolves the binary (configured, or next to the running executable) and
    /// a socket in a fresh folder only this user can enter.
    pub fn new(
        host: LocalGpuHost,
        telemetry: ChildTelemetry,
    ) -> Result<ChildConfig, SupervisorError> {
        let binary = match &host.binary {
            Some(binary) => binary.clone(),
            None => {
                let exe = std::env::current_exe().map_err(SupervisorError::CurrentExe)?;
                let sibling = exe.with_file_name("bulkhead-gpu-host");
                if !sibling.is_file() {
                    return Err(SupervisorError::BinaryNotFound(exe));
                }
                sibling
            }
        };
        let dir = std::env::temp_dir().join(format!("bulkhead-{}", std::process::id()));
        private_dir(&dir).map_err(|source| SupervisorError::SocketDir {
            path: dir.clone(),
            source,
        })?;
        Ok(ChildConfig {
            binary,
            socket: dir.join("gpu-host.sock"),
            host,
            telemetry,
        })
    }

    fn command(&self) -> Command {
        let mut command = Command::new(&self.binary);
        command
            .arg("serve")
            .arg("--listen")
            .arg(format!("unix:{}", self.socket.display()))
            .arg("--workers")
            .arg(self.host.workers.to_string())
            .arg("--queue-capacity")
            .arg(self.host.queue_capacity.to_string())
            .arg("--exit-with-parent")
            .arg("--log-format")
            .arg(self.telemetry.log_format.as_str());
        command.envs(self.telemetry.env.iter().map(|(k, v)| (k, v)));
        // The backend of the device `policy check` planned for, never
        // `auto`: a child that found a GPU where the policy says "cpu", or
        // none where it says "mi325x", would refuse the layouts the check
        // accepted. Without the GPU (or a build with HIP), "mi325x" fails
        // to start with the child's own reason, restarted with backoff.
        let backend = if self.host.device.xcds.is_some() {
            "hip"
        } else {
            "cpu"
        };
        command.arg("--backend").arg(backend);
        if let Some(rate) = self.host.scrub_bytes_per_s {
            command.arg("--scrub-bytes-per-s").arg(rate.to_string());
        }
        if let Some(floor) = self.host.scrub_min_bytes_per_s {
            command
                .arg("--scrub-min-bytes-per-s")
                .arg(floor.to_string());
        }
        if let Some(threads) = self.host.threads {
            command.arg("--threads").arg(threads.to_string());
        }
        // The KV memory `policy check` planned the tenants with, so the
        // child accepts the same tenant sets (its own default may differ).
        if let Some(bytes) = self.host.kv_memory_bytes() {
            command.arg("--kv-memory").arg(format!("{bytes}B"));
        }
        // No `--model`: models given on the command line are loaded
        // unchecked. The gateway loads each registration by `LoadModel`,
        // with its signed digests, once the child listens.
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        command
    }
}

/// A folder with mode 0700; an existing one (a previous gateway with our pid)
/// is reused only if it is ours to use.
fn private_dir(dir: &Path) -> std::io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        }
        Err(e) => Err(e),
    }
}

/// Keeps the local gpu-host running until [`Supervisor::stop`].
#[derive(Debug)]
pub struct Supervisor {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    socket: PathBuf,
}

impl Supervisor {
    /// Starts the first child; `state` follows its life, `starts` counts
    /// the children started (the first one included).
    pub fn start(
        config: ChildConfig,
        state: watch::Sender<UpstreamState>,
        starts: Counter,
    ) -> Supervisor {
        let (stop, stop_rx) = watch::channel(false);
        let socket = config.socket.clone();
        let task = tokio::spawn(supervise(config, state, stop_rx, starts));
        Supervisor { stop, task, socket }
    }

    /// Asks the child to drain and exit (SIGKILL after a grace period) and
    /// stops restarting it.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        if let Some(dir) = self.socket.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

async fn supervise(
    config: ChildConfig,
    state: watch::Sender<UpstreamState>,
    mut stop: watch::Receiver<bool>,
    starts: Counter,
) {
    let mut backoff = INITIAL_BACKOFF;
    let max_backoff = config.host.restart_backoff_max.max(INITIAL_BACKOFF);
    loop {
        state.send_replace(UpstreamState::Starting);
        let started = Instant::now();
        match config.command().spawn() {
            Ok(child) => {
                starts.inc();
                let pid = child.id().unwrap_or(0);
                tracing::info!(pid, binary = %config.binary.display(), "gpu-host started");
                if run_child(child, &state, &mut stop).await {
                    break;
                }
            }
            Err(e) => tracing::error!(
                binary = %config.binary.display(),
                "cannot start the gpu-host: {e}"
            ),
        }
        if started.elapsed() >= HEALTHY_UPTIME {
            backoff = INITIAL_BACKOFF;
        }
        state.send_replace(UpstreamState::Starting);
        tracing::warn!("restarting the gpu-host in {} ms", backoff.as_millis());
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            () = stopped(&mut stop) => break,
        }
        backoff = (backoff * 2).min(max_backoff);
    }
    state.send_replace(UpstreamState::Stopped);
}

/// Runs one child until it exits (false) or we are told to stop (true).
async fn run_child(
    mut child: Child,
    state: &watch::Sender<UpstreamState>,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    let stdin = child.stdin.take();
    if let Some(stdout) = child.stdout.take() {
        let state = state.clone();
        // The host prints one `listening on …` line once its socket accepts;
        // anything else on stdout is passed on to our log.
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if line.starts_with("listening on ") {
                    tracing::info!("gpu-host {line}");
                    state.send_replace(UpstreamState::Ready);
                } else {
                    tracing::info!("gpu-host: {line}");
                }
            }
        });
    }
    tokio::select! {
        status = child.wait() => {
            state.send_replace(UpstreamState::Starting);
            match status {
                Ok(status) => tracing::error!("the gpu-host exited: {status}"),
                Err(e) => tracing::error!("waiting for the gpu-host: {e}"),
            }
            false
        }
        () = stopped(stop) => {
            // Closing its stdin asks the child to drain and exit.
            drop(stdin);
            if tokio::time::timeout(STOP_GRACE, child.wait()).await.is_err() {
                tracing::warn!("the gpu-host did not exit within {} s; killing it", STOP_GRACE.as_secs());
                let _ = child.kill().await;
            }
            true
        }
    }
}

/// Resolves once the supervisor is told to stop (or its handle is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is not `Send`; drop it here.
    let _ = stop.wait_for(|s| *s).await.map(|_| ());
}

#[cfg(test)]
mod tests {

    use super::*;

    fn args(host: LocalGpuHost) -> Vec<String> {
        let config = ChildConfig {
            binary: PathBuf::from("/bin/bulkhead-gpu-host"),
            socket: PathBuf::from("/tmp/s.sock"),
            host,
            telemetry: ChildTelemetry::default(),
        };
        config
            .command()
            .as_std()
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    fn host(device: Device, threads: Option<usize>) -> LocalGpuHost {
        LocalGpuHost {
            binary: None,
            threads,
            workers: 4,
            queue_capacity: 8,
            restart_backoff_max: Duration::from_secs(1),
            scrub_bytes_per_s: None,
            scrub_min_bytes_per_s: None,
            device,
            model_reservation_bytes: 256 << 20,
        }
    }

    fn value_of<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
        let at = args.iter().position(|a| a == flag)?;
        args.get(at + 1).map(String::as_str)
    }

    #[test]
    fn the_child_gets_the_cores_and_kv_memory_policy_check_planned_with() {
        let cpu = Device::cpu(2, 1 << 30).unwrap();
        let args = args(host(cpu, Some(2)));
        assert_eq!(value_of(&args, "--threads"), Some("2"));
        // 1GiB of memory less the 256MiB model reservation.
        assert_eq!(value_of(&args, "--kv-memory"), Some("805306368B"));
        assert_eq!(
            bulkhead_partition::parse_bytes("805306368B").unwrap(),
            768 << 20
        );
        assert_eq!(value_of(&args, "--workers"), Some("4"));
        assert_eq!(value_of(&args, "--backend"), Some("cpu"));
    }

    #[test]
    fn a_gpu_device_leaves_the_child_its_own_memory() {
        let args = args(host(Device::mi325x(), None));
        assert_eq!(value_of(&args, "--kv-memory"), None);
        assert_eq!(value_of(&args, "--threads"), None);
        // The GPU the policy planned for, not whatever `auto` finds.
        assert_eq!(value_of(&args, "--backend"), Some("hip"));
    }

    #[test]
    fn the_scrub_rates_are_passed_only_when_set() {
        let cpu = Device::cpu(2, 1 << 30).unwrap();
        let args_default = args(host(cpu.clone(), None));
        assert_eq!(value_of(&args_default, "--scrub-bytes-per-s"), None);
        assert_eq!(value_of(&args_default, "--scrub-min-bytes-per-s"), None);
        let args = args(LocalGpuHost {
            scrub_bytes_per_s: Some(1_000_000),
            scrub_min_bytes_per_s: Some(0),
            ..host(cpu, None)
        });
        assert_eq!(value_of(&args, "--scrub-bytes-per-s"), Some("1000000"));
        assert_eq!(value_of(&args, "--scrub-min-bytes-per-s"), Some("0"));
    }
}
