//! The gateway and a remote gpu-host over mutual TLS: the host refuses
//! plaintext clients, clients without a certificate and clients whose
//! certificate another CA signed; the gateway, with its certificate, the
//! host's CA and the bearer secret, serves completions through it.
//! Certificates: `tests/fixtures/tls` (`make.sh` made them with openssl).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use bulkhead_protocol::v1::HealthRequest;
use bulkhead_protocol::v1::gpu_host_client::GpuHostClient;
use bulkhead_protocol::{AUTHORIZATION, ClientTls, Target, bearer_value, connect, connect_with};
use bulkhead_tests::{Gateway, PolicyDir, bin, demo_model_dir, demo_model_signature, repo};

const SECRET: &str = "tls-test-secret-0123456789abcdef";
const MODEL: &str = "bulkhead-demo-tiny";

fn tls(name: &str) -> PathBuf {
    repo().join("tests/fixtures/tls").join(name)
}

fn read(name: &str) -> Vec<u8> {
    std::fs::read(tls(name)).unwrap()
}

/// A gpu-host on TCP over mutual TLS, and the address it listens on.
struct Host {
    child: Child,
    dir: PathBuf,
    target: Target,
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A host for test `name`, in a folder of its own (the tests run at once).
fn start_host(name: &str) -> Host {
    start_host_on(name, "tcp:127.0.0.1:0")
}

/// [`start_host`], listening on `listen`.
fn start_host_on(name: &str, listen: &str) -> Host {
    let dir = std::env::temp_dir().join(format!(
        "bulkhead-e2e-tls-host-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let secret = dir.join("secret");
    std::fs::write(&secret, format!("{SECRET}\n")).unwrap();
    let mut child = Command::new(bin("bulkhead-gpu-host"))
        .args(["serve", "--listen", listen, "--threads", "1"])
        .arg("--auth-token-file")
        .arg(&secret)
        .arg("--tls-cert")
        .arg(tls("server.pem"))
        .arg("--tls-key")
        .arg(tls("server.key"))
        .arg("--tls-client-ca")
        .arg(tls("ca.pem"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("bulkhead-gpu-host starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let target = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .parse()
        .unwrap();
    Host { child, dir, target }
}

/// What `Health` answers a client connecting with `tls` (and the secret).
async fn health(target: &Target, tls: Option<&ClientTls>) -> Result<bool, String> {
    let channel = match tls {
        Some(tls) => connect_with(target, Some(tls)).await,
        None => connect(target).await,
    }
    .map_err(|e| e.to_string())?;
    let mut request = tonic::Request::new(HealthRequest {});
    request
        .metadata_mut()
        .insert(AUTHORIZATION, bearer_value(SECRET).parse().unwrap());
    GpuHostClient::new(channel)
        .health(request)
        .await
        .map(|r| r.into_inner().serving)
        .map_err(|e| e.to_string())
}

#[tokio::test]
async fn a_tls_host_serves_only_clients_with_a_certificate_its_ca_signed() {
    let host = start_host("ca");
    let client = |identity: Option<(&str, &str)>, ca: &str| ClientTls {
        ca_pem: read(ca),
        identity: identity.map(|(cert, key)| (read(cert), read(key))),
        server_name: None,
    };
    let ours = client(Some(("client.pem", "client.key")), "ca.pem");
    assert_eq!(health(&host.target, Some(&ours)).await, Ok(true));
    // By name instead of IP: the certificate carries both.
    let by_name = ClientTls {
        server_name: Some("gpu-host.test".into()),
        ..ours.clone()
    };
    assert_eq!(health(&host.target, Some(&by_name)).await, Ok(true));
    let refusals = [
        ("plaintext", None),
        ("no client certificate", Some(client(None, "ca.pem"))),
        (
            "a certificate another CA signed",
            Some(client(
                Some(("other-client.pem", "other-client.key")),
                "ca.pem",
            )),
        ),
        (
            "a host its CA does not vouch for",
            Some(client(Some(("client.pem", "client.key")), "other-ca.pem")),
        ),
        (
            "another name",
            Some(ClientTls {
                server_name: Some("elsewhere.test".into()),
                ..ours.clone()
            }),
        ),
    ];
    for (what, tls) in refusals {
        let answer = health(&host.target, tls.as_ref()).await;
        assert!(answer.is_err(), "{what}: {answer:?}");
    }
}

#[test]
fn the_gateway_serves_completions_through_a_mutual_tls_host() {
    let host = start_host("gateway");
    let Target::Tcp(addr) = host.target else {
        unreachable!()
    };
    serves_completions_through(&format!("tcp:{addr}"), "", "tls-upstream");
}

#[test]
fn the_gateway_reaches_a_host_by_name() {
    // `localhost` is looked up when connecting; the host's certificate
    // names `gpu-host.test` (and 127.0.0.1), so the gateway is told to
    // expect that name, as with a Kubernetes pod's DNS name.
    let host = start_host("gateway-by-name");
    let Target::Tcp(addr) = host.target else {
        unreachable!()
    };
    serves_completions_through(
        &format!("tcp:localhost:{}", addr.port()),
        "tls_server_name = \"gpu-host.test\"\n",
        "tls-upstream-by-name",
    );
}

#[test]
fn a_remote_host_that_restarts_empty_gets_its_models_before_the_next_request() {
    let host = start_host("restart");
    let Target::Tcp(addr) = host.target.clone() else {
        unreachable!()
    };
    let (policies, gateway) = gateway_for(&format!("tcp:{addr}"), "", "tls-upstream-restart");
    let token = policies.token("demo", &[]);
    let body = format!(r#"{{"model":"{MODEL}","prompt":"Emma","max_tokens":3}}"#);
    let r = gateway.request("POST", "/v1/completions", Some(&token), Some(&body));
    assert_eq!(r.status, 200, "{}", r.body);
    // The host restarts on the same address holding no model; the gateway
    // has not polled it yet (its periodic pass is 15 s away).
    let skip = gateway.log.len();
    drop(host);
    let _host = start_host_on("restart", &format!("tcp:{addr}"));
    let r = gateway.request("POST", "/v1/completions", Some(&token), Some(&body));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["usage"]["completion_tokens"], 3);
    // Either the request found the model missing, or a health check saw
    // the host answer with fewer models first; both load it again before
    // the request is served.
    let log = gateway.log.text();
    let after: String = log.lines().skip(skip).collect::<Vec<_>>().join("\n");
    assert!(
        after.contains("loading it again") || after.contains("holds fewer models"),
        "{after}"
    );
}

/// A gateway with `[upstream] target` (and `extra` upstream keys) answers
/// a completion through the mutual-TLS host.
fn serves_completions_through(target: &str, extra: &str, name: &str) {
    let (policies, gateway) = gateway_for(target, extra, name);
    let token = policies.token("demo", &[]);
    let body = format!(r#"{{"model":"{MODEL}","prompt":"Emma","max_tokens":3}}"#);
    let r = gateway.request("POST", "/v1/completions", Some(&token), Some(&body));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["usage"]["completion_tokens"], 3);
}

/// A ready gateway whose `[upstream]` is `target` (with `extra` keys), over
/// mutual TLS with the test certificates, serving the demo model.
fn gateway_for(target: &str, extra: &str, name: &str) -> (PolicyDir, Gateway) {
    let policies = PolicyDir::new(name);
    policies.write("secret", &format!("{SECRET}\n"));
    policies.write(
        "gateway.toml",
        &format!(
            "[upstream]\ntarget = \"{target}\"\nsecret_file = \"secret\"\n{extra}\
             tls_ca = \"{}\"\ntls_cert = \"{}\"\ntls_key = \"{}\"\n\n\
             [[upstream.models]]\nname = \"{MODEL}\"\ndir = \"{}\"\nsignature = \"{}\"\n{}",
            tls("ca.pem").display(),
            tls("client.pem").display(),
            tls("client.key").display(),
            demo_model_dir().display(),
            demo_model_signature().display(),
            bulkhead_tests::operator_table(),
        ),
    );
    let gateway = Gateway::start(&policies);
    gateway.wait_ready();
    (policies, gateway)
}
