//! Test harness for the end-to-end tests: starts the real `bulkhead` (which
//! starts the real `bulkhead-gpu-host`) on loopback with a policy folder of
//! the test's making, and talks plain HTTP/1.1 to it as a client would.

#![forbid(unsafe_code)]

pub mod otlp;
pub mod proxy;
pub mod redis;

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long a gateway may take to start its gpu-host and load the model.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A binary of this workspace, built by the same `cargo test` run (it sits
/// next to the test executable's `deps/` folder).
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let path = dir.join(name);
    let built = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| {
            panic!(
                "{} is missing: run the tests with `cargo test --workspace` (or build it first)",
                path.display()
            )
        });
    // `cargo test -p bulkhead-tests` alone does not rebuild other packages'
    // binaries; refuse to test a stale one.
    // What each binary is built from (its crate and the workspace crates
    // it depends on): a gateway-only change does not make the gpu-host
    // stale.
    let sources: &[&str] = match name {
        "bulkhead-gpu-host" => &["gpu-host/src", "protocol", "partition/src", "kernels/src"],
        "bulkhead" => &[
            "gateway/src",
            "protocol",
            "partition/src",
            "audit/src",
            "durable/src",
            "model-signing/src",
            "plugin-host/src",
            "state/src",
        ],
        _ => &[
            "gateway/src",
            "gpu-host/src",
            "protocol",
            "partition/src",
            "kernels/src",
            "audit/src",
            "durable/src",
            "model-signing/src",
            "plugin-host/src",
            "state/src",
        ],
    };
    let newest_source = sources
        .iter()
        .filter_map(|d| newest_mtime(&repo().join(d)))
        .max();
    if let Some(source) = newest_source {
        assert!(
            source <= built,
            "{} is older than its sources: run `cargo test --workspace` or \
             `cargo build -p bulkhead-gateway -p bulkhead-gpu-host` first",
            path.display()
        );
    }
    path
}

/// The newest modification time under `dir`, leaving out unit-test
/// modules (`tests/`, `tests.rs`): they are not part of a binary, so
/// editing one does not relink it.
fn newest_mtime(dir: &Path) -> Option<std::time::SystemTime> {
    let mut newest = None;
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let name = entry.file_name();
        if name == "tests" || name == "tests.rs" {
            continue;
        }
        let meta = entry.metadata().ok()?;
        let mtime = if meta.is_dir() {
            newest_mtime(&entry.path())
        } else {
            meta.modified().ok()
        };
        newest = newest.max(mtime);
    }
    newest
}

/// The demo model's folder, signed as a whole by the development
/// publisher `bulkhead-dev` (`tools/demo-model/sign`).
pub fn demo_model_dir() -> PathBuf {
    repo()
        .join("models/bulkhead-demo-tiny")
        .canonicalize()
        .expect("the demo model is in the repository")
}

/// The demo model folder's signature bundle.
pub fn demo_model_signature() -> PathBuf {
    demo_model_dir().with_extension("sig")
}

/// The demo model's GGUF (inside [`demo_model_dir`]).
pub fn demo_model() -> PathBuf {
    demo_model_dir().join("bulkhead-demo-tiny-q8_0.gguf")
}

/// A `[[local_gpu_host.models]]` entry serving the signed demo model as
/// `name`.
pub fn demo_model_entry(name: &str) -> String {
    format!(
        "\n[[local_gpu_host.models]]\nname = \"{name}\"\ndir = \"{}\"\nsignature = \"{}\"\n",
        demo_model_dir().display(),
        demo_model_signature().display()
    )
}

/// `bulkhead model keygen` into `dir/NAME.pem` (and `NAME.pub.pem`).
pub fn model_keygen(dir: &Path, name: &str) -> PathBuf {
    let key = dir.join(format!("{name}.pem"));
    let (ok, out) = cli(&["model", "keygen", "--out", key.to_str().unwrap()]);
    assert!(ok, "{out}");
    key
}

/// A model folder `dir/NAME/` holding a copy of the demo GGUF, signed with
/// `key` into `dir/NAME.sig`: (folder, signature).
pub fn signed_model_copy(dir: &Path, name: &str, key: &Path) -> (PathBuf, PathBuf) {
    let folder = dir.join(name);
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::copy(demo_model(), folder.join("model.gguf")).unwrap();
    let signature = dir.join(format!("{name}.sig"));
    let (ok, out) = cli(&[
        "model",
        "sign",
        folder.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
        "--signature",
        signature.to_str().unwrap(),
    ]);
    assert!(ok, "{out}");
    (folder, signature)
}

/// The body of `POST /admin/v1/models` registering `dir` as `name`.
pub fn register_body(name: &str, dir: &Path, signature: &Path) -> String {
    let bundle: serde_json::Value =
        serde_json::from_slice(&std::fs::read(signature).unwrap()).unwrap();
    serde_json::json!({"name": name, "dir": dir, "signature": bundle}).to_string()
}

/// Runs `bulkhead ARGS`: whether it succeeded, and its stdout then stderr.
pub fn cli(args: &[&str]) -> (bool, String) {
    let out = Command::new(bin("bulkhead")).args(args).output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// A policy folder in a fresh temp dir, starting as a copy of `policies/`
/// (whose trust.toml trusts the demo model's publisher) with a
/// `gateway.toml` pointing at the signed demo model by absolute path, and a
/// plugin store and model registry of its own beside it (outside the
/// watched folder).
#[derive(Debug)]
pub struct PolicyDir {
    pub path: PathBuf,
    /// The plugin store `gateway.toml` names (`[plugins] store`).
    pub store: PathBuf,
    /// The model registry `gateway.toml` names (`[models] registry`).
    pub registry: PathBuf,
}

impl PolicyDir {
    pub fn new(name: &str) -> PolicyDir {
        let path = std::env::temp_dir().join(format!("bulkhead-e2e-{name}-{}", std::process::id()));
        let store =
            path.with_file_name(format!("bulkhead-e2e-{name}-{}-store", std::process::id()));
        let registry = path.with_file_name(format!(
            "bulkhead-e2e-{name}-{}-registry",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&path);
        let _ = std::fs::remove_dir_all(&store);
        let _ = std::fs::remove_dir_all(&registry);
        copy_dir(&repo().join("policies"), &path);
        let dir = PolicyDir {
            path,
            store,
            registry,
        };
        dir.write(
            "gateway.toml",
            &format!("{}{}", gateway_toml(""), dir.state_tables()),
        );
        dir
    }

    /// The `[plugins]` and `[models]` tables naming this folder's own
    /// plugin store and model registry.
    pub fn state_tables(&self) -> String {
        format!(
            "\n[plugins]\nstore = \"{}\"\n\n[models]\nregistry = \"{}\"\n",
            self.store.display(),
            self.registry.display()
        )
    }

    /// Trusts the publisher whose key `bulkhead model keygen` wrote to
    /// `key` (its `.pub.pem` beside it) as `name`, and lets the `demo`
    /// tenant use `model` besides the demo model.
    pub fn trust_publisher_for(&self, name: &str, key: &Path, model: &str) {
        let public = std::fs::read_to_string(key.with_extension("pub.pem")).unwrap();
        self.write(&format!("trust/{name}.pub.pem"), &public);
        let trust = self.read("trust.toml");
        self.write(
            "trust.toml",
            &format!(
                "{trust}\n[[publishers]]\nname = \"{name}\"\npublic_key = \"trust/{name}.pub.pem\"\n"
            ),
        );
        let demo = self.read("tenants/demo.toml").replace(
            "models = [\"bulkhead-demo-tiny\"]",
            &format!("models = [\"bulkhead-demo-tiny\", \"{model}\"]"),
        );
        self.write("tenants/demo.toml", &demo);
    }

    /// Writes (atomically: temp file + rename) a file of the folder.
    pub fn write(&self, relative: &str, text: &str) {
        let target = self.path.join(relative);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        let temp = self
            .path
            .join(format!(".{}.tmp", relative.replace('/', "_")));
        std::fs::write(&temp, text).unwrap();
        std::fs::rename(&temp, &target).unwrap();
    }

    /// Replaces the `[limits]` of the `demo` tenant (the table closes its
    /// file) with `limits` (TOML lines).
    pub fn set_demo_limits(&self, limits: &str) {
        let demo = self.read("tenants/demo.toml");
        let demo = demo.find("[limits]").map_or(demo.as_str(), |i| &demo[..i]);
        self.write(
            "tenants/demo.toml",
            &format!("{demo}\n[limits]\n{limits}\n"),
        );
    }

    pub fn read(&self, relative: &str) -> String {
        std::fs::read_to_string(self.path.join(relative)).unwrap()
    }

    /// Mints a token with `bulkhead token issue` (the development tool).
    pub fn token(&self, tenant: &str, extra: &[&str]) -> String {
        self.issue(&["--tenant", tenant], extra)
    }

    /// Mints an operator token with these scopes (and `extra` arguments,
    /// e.g. `--sub`), signed by the development operator issuer that
    /// [`gateway_toml`] configures.
    pub fn operator_token(&self, scopes: &[&str], extra: &[&str]) -> String {
        let mut args = vec!["--operator"];
        for scope in scopes {
            args.extend(["--scope", scope]);
        }
        self.issue(&args, extra)
    }

    fn issue(&self, who: &[&str], extra: &[&str]) -> String {
        let out = Command::new(bin("bulkhead"))
            .args(["token", "issue", "--policies"])
            .arg(&self.path)
            .args(who)
            .args(extra)
            .output()
            .expect("bulkhead token issue runs");
        assert!(
            out.status.success(),
            "token issue failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }
}

impl Drop for PolicyDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
        let _ = std::fs::remove_dir_all(&self.store);
        let _ = std::fs::remove_dir_all(&self.registry);
    }
}

/// A `gateway.toml` serving the signed demo model as `bulkhead-demo-tiny`
/// from a local gpu-host with one thread, with the development operator
/// issuer ([`OPERATOR_ISSUER`]), plus `extra` top-level settings.
pub fn gateway_toml(extra: &str) -> String {
    format!(
        "{extra}\n{}\n[local_gpu_host]\nthreads = 1\nworkers = 2\nrestart_backoff_max_ms = 500\n{}",
        operator_table(),
        demo_model_entry("bulkhead-demo-tiny")
    )
}

/// Every operator scope, for tests that act as a do-everything operator.
pub const ALL_OPERATOR_SCOPES: [&str; 8] = [
    "models:read",
    "models:write",
    "audit:read",
    "partitions:read",
    "tenants:read",
    "usage:read",
    "gpu-hosts:read",
    "gpu-hosts:write",
];

/// The issuer of [`PolicyDir::operator_token`]'s tokens.
pub const OPERATOR_ISSUER: &str = "bulkhead-dev-operator";

/// The development operator issuer of the default policies, as a table.
pub fn operator_table() -> String {
    format!(
        "[[operator.issuers]]\nissuer = \"{OPERATOR_ISSUER}\"\naudience = [\"bulkhead-admin\"]\n\
         algorithms = [\"EdDSA\"]\npublic_keys = [\"dev-keys/operator.pub.pem\"]\n\
         dev_signing_key = \"dev-keys/operator.key.pem\"\n"
    )
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// Lines a child wrote to stderr, kept for assertions and failure output.
#[derive(Debug, Default)]
pub struct Log {
    lines: Mutex<Vec<String>>,
    changed: Condvar,
}

impl Log {
    fn collect(self: &Arc<Self>, stream: impl Read + Send + 'static) {
        let log = Arc::clone(self);
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines() {
                let Ok(line) = line else { break };
                log.lines.lock().unwrap().push(line);
                log.changed.notify_all();
            }
        });
    }

    /// Waits until a line containing `needle` appears after the first `skip`
    /// lines; returns it with its index.
    pub fn wait_for(&self, needle: &str, skip: usize, timeout: Duration) -> (usize, String) {
        let deadline = Instant::now() + timeout;
        let mut lines = self.lines.lock().unwrap();
        loop {
            if let Some((i, line)) = lines
                .iter()
                .enumerate()
                .skip(skip)
                .find(|(_, l)| l.contains(needle))
            {
                return (i, line.clone());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "no log line with {needle:?} in {timeout:?}:\n{}",
                lines.join("\n")
            );
            lines = self.changed.wait_timeout(lines, left).unwrap().0;
        }
    }

    pub fn len(&self) -> usize {
        self.lines.lock().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn text(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }
}

/// A running `bulkhead serve`, killed on drop. Derefs to a [`Client`] of
/// its public listener; [`Gateway::admin`] is its admin listener's.
#[derive(Debug)]
pub struct Gateway {
    child: Child,
    client: Client,
    pub addr: SocketAddr,
    /// The operator API and `/metrics`.
    pub admin: Client,
    pub log: Arc<Log>,
}

impl std::ops::Deref for Gateway {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.client
    }
}

/// Plain HTTP/1.1 to the gateway, one connection per request.
#[derive(Clone, Copy, Debug)]
pub struct Client {
    pub addr: SocketAddr,
}

impl Gateway {
    /// Starts the gateway on free loopback ports (public and admin) and
    /// waits until it is ready.
    pub fn start(policies: &PolicyDir) -> Gateway {
        Gateway::start_with_env(policies, &[])
    }

    /// [`Gateway::start`] with more environment variables.
    pub fn start_with_env(policies: &PolicyDir, env: &[(&str, &str)]) -> Gateway {
        let mut child = Command::new(bin("bulkhead"))
            .arg("serve")
            .arg("--policies")
            .arg(&policies.path)
            .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("bulkhead starts");
        let log = Arc::new(Log::default());
        log.collect(child.stderr.take().unwrap());
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let Some(addr) = line.trim().strip_prefix("listening on http://") else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("bulkhead did not start: {line:?}\n{}", log.text());
        };
        let addr = addr.parse().unwrap();
        line.clear();
        stdout.read_line(&mut line).unwrap();
        let Some(admin) = line.trim().strip_prefix("admin listening on http://") else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "bulkhead did not say its admin address: {line:?}\n{}",
                log.text()
            );
        };
        let admin = Client {
            addr: admin.parse().unwrap(),
        };
        let gateway = Gateway {
            addr,
            client: Client { addr },
            admin,
            child,
            log,
        };
        gateway.wait_ready();
        gateway
    }

    /// Polls `/readyz` until it says ready (the gpu-host is up).
    pub fn wait_ready(&self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Ok(r) = self.try_request("GET", "/readyz", None, None)
                && r.status == 200
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "not ready after {READY_TIMEOUT:?}:\n{}",
                self.log.text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The pid of the gpu-host child the gateway started last.
    pub fn gpu_host_pid(&self, skip_lines: usize) -> (usize, u32) {
        let (i, line) = self
            .log
            .wait_for("gpu-host started", skip_lines, READY_TIMEOUT);
        let pid = line
            .split("pid=")
            .nth(1)
            .map(|s| s.trim_start_matches(|c: char| !c.is_ascii_digit()))
            .and_then(|s| s.split_whitespace().next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no pid in {line:?}"));
        (i, pid)
    }

    /// A metric from the admin listener's `/metrics` (see [`Client::metric`]).
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.admin.metric(name, labels)
    }

    /// The gateway's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM while `stream` is open (its first event read) and
    /// checks that it still runs to `[DONE]` and the gateway exits 0.
    pub fn terminate_during(self, stream: &mut EventStream) {
        let terminating = std::thread::spawn(move || self.terminate());
        let events = stream.events();
        assert_eq!(
            events.last().map(String::as_str),
            Some("[DONE]"),
            "{events:?}"
        );
        let status = terminating.join().unwrap();
        assert!(status.success(), "{status}");
    }

    /// Polls `done` until it holds; fails after 30 s with `what` and the log.
    pub fn eventually(&self, what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !done() {
            assert!(
                Instant::now() < deadline,
                "never {what}:\n{}",
                self.log.text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        self.child.wait().unwrap()
    }
}

impl Client {
    pub fn new(addr: SocketAddr) -> Client {
        Client { addr }
    }

    pub fn request(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> Response {
        self.try_request(method, path, token, body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    pub fn try_request(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> std::io::Result<Response> {
        let mut stream = self.send(method, path, token, body)?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw)?;
        Ok(Response::parse(&raw))
    }

    /// A request with a binary body of `content_type` (plugin uploads).
    pub fn request_bytes(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        content_type: &str,
        body: &[u8],
    ) -> Response {
        let mut raw = Vec::new();
        self.send_bytes(method, path, token, content_type, body)
            .and_then(|mut stream| stream.read_to_end(&mut raw))
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        Response::parse(&raw)
    }

    /// A JSON request with extra headers (e.g. a `traceparent`).
    pub fn request_with(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Response {
        let mut raw = Vec::new();
        self.send_raw(
            method,
            path,
            token,
            "application/json",
            headers,
            body.as_bytes(),
        )
        .and_then(|mut stream| stream.read_to_end(&mut raw))
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        Response::parse(&raw)
    }

    /// A binary upload with extra headers (e.g. a plugin signature).
    pub fn request_bytes_with(
        &self,
        method: &str,
        path: &str,
        token: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Response {
        let mut raw = Vec::new();
        self.send_raw(method, path, Some(token), "application/wasm", headers, body)
            .and_then(|mut stream| stream.read_to_end(&mut raw))
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        Response::parse(&raw)
    }

    /// Sends a request and returns the open connection (for streaming).
    pub fn send(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> std::io::Result<TcpStream> {
        let body = body.unwrap_or("");
        self.send_bytes(method, path, token, "application/json", body.as_bytes())
    }

    fn send_bytes(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        content_type: &str,
        body: &[u8],
    ) -> std::io::Result<TcpStream> {
        self.send_raw(method, path, token, content_type, &[], body)
    }

    fn send_raw(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        content_type: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<TcpStream> {
        let mut stream = TcpStream::connect(self.addr)?;
        stream.set_read_timeout(Some(Duration::from_secs(120)))?;
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nhost: {}\r\nconnection: close\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n",
            self.addr,
            body.len()
        );
        if let Some(token) = token {
            head.push_str(&format!("authorization: Bearer {token}\r\n"));
        }
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes())?;
        stream.write_all(body)?;
        Ok(stream)
    }

    /// Opens a streaming request; read its events with [`EventStream::next_event`].
    pub fn stream(&self, path: &str, token: &str, body: &str) -> EventStream {
        let stream = self.send("POST", path, Some(token), Some(body)).unwrap();
        EventStream::new(stream)
    }

    /// A metric's value (summed over series whose labels contain every
    /// `labels` pair), from this listener's `/metrics` (the admin one's).
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let text = self.request("GET", "/metrics", None, None).body;
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
                (metric == name
                    && labels
                        .iter()
                        .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\""))))
                .then(|| value.parse::<f64>().ok())?
            })
            .sum()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A whole HTTP response.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    /// Lower-cased names.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    pub fn parse(raw: &[u8]) -> Response {
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("a complete HTTP head");
        let head = String::from_utf8_lossy(&raw[..split]).to_string();
        let mut lines = head.lines();
        let status = lines
            .next()
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|s| s.parse().ok())
            .expect("a status line");
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let mut body = raw[split + 4..].to_vec();
        if headers
            .iter()
            .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"))
        {
            body = dechunk(&body);
        }
        Response {
            status,
            headers,
            body: String::from_utf8_lossy(&body).to_string(),
        }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }

    /// `error.code` of an OpenAI error body.
    pub fn error_code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .unwrap_or("")
            .to_string()
    }
}

fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = body.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(std::str::from_utf8(&body[..eol]).unwrap().trim(), 16)
            .expect("chunk size");
        body = &body[eol + 2..];
        if size == 0 {
            break;
        }
        out.extend_from_slice(&body[..size.min(body.len())]);
        body = &body[(size + 2).min(body.len())..];
    }
    out
}

/// A streaming response read event by event. Dropping it closes the connection.
#[derive(Debug)]
pub struct EventStream {
    reader: BufReader<TcpStream>,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    chunked: bool,
    pending: VecDeque<String>,
    buffer: String,
}

impl EventStream {
    fn new(stream: TcpStream) -> EventStream {
        let mut reader = BufReader::new(stream);
        let mut status_line = String::new();
        reader.read_line(&mut status_line).unwrap();
        let status = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
        let mut headers = Vec::new();
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':') {
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
        let chunked = headers
            .iter()
            .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
        EventStream {
            reader,
            status,
            headers,
            chunked,
            pending: VecDeque::new(),
            buffer: String::new(),
        }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The next `data:` payload, or `None` at the end of the response.
    pub fn next_event(&mut self) -> Option<String> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some(event);
            }
            let bytes = self.read_more()?;
            self.buffer.push_str(&String::from_utf8_lossy(&bytes));
            while let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let data: Vec<&str> = block
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(|d| d.strip_prefix(' ').unwrap_or(d))
                    .collect();
                if !data.is_empty() {
                    self.pending.push_back(data.join("\n"));
                }
            }
        }
    }

    /// Every `data:` payload left, to the end of the response.
    pub fn events(&mut self) -> Vec<String> {
        std::iter::from_fn(|| self.next_event()).collect()
    }

    /// Everything left of the body (for error responses).
    pub fn rest(&mut self) -> String {
        let mut out = std::mem::take(&mut self.buffer);
        while let Some(bytes) = self.read_more() {
            out.push_str(&String::from_utf8_lossy(&bytes));
        }
        out
    }

    fn read_more(&mut self) -> Option<Vec<u8>> {
        if !self.chunked {
            let mut buf = vec![0u8; 4096];
            let n = self.reader.read(&mut buf).ok()?;
            return (n > 0).then(|| buf[..n].to_vec());
        }
        let mut size_line = String::new();
        if self.reader.read_line(&mut size_line).ok()? == 0 {
            return None;
        }
        let size = usize::from_str_radix(size_line.trim(), 16).ok()?;
        if size == 0 {
            return None;
        }
        let mut chunk = vec![0u8; size + 2];
        self.reader.read_exact(&mut chunk).ok()?;
        chunk.truncate(size);
        Some(chunk)
    }
}
