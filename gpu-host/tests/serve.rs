//! `bulkhead-gpu-host serve`, started as a user starts it, driven by the
//! `bulkhead-protocol` client over a Unix socket (and TCP for auth).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bulkhead_protocol::digest::{FileDigest, to_hex};
use bulkhead_protocol::v1::generate_event::Event;
use bulkhead_protocol::v1::generate_request::Prompt;
use bulkhead_protocol::v1::gpu_host_client::GpuHostClient;
use bulkhead_protocol::v1::{self, FinishReason};
use bulkhead_protocol::{AUTHORIZATION, Target, bearer_value, connect};
use serde_json::Value;
use tonic::transport::Channel;
use tonic::{Code, Request};

mod common;

use common::{Host, bin, model, temp_dir};

const SECRET: &str = "correct-horse-battery-staple-0123";

/// Both fixture models, as `llama` and `qwen`.
fn model_args() -> Vec<String> {
    vec![
        "--model".into(),
        format!("llama={}", model("llama-q8_0.gguf")),
        "--model".into(),
        format!("qwen={}", model("qwen2-q4_0.gguf")),
        "--threads".into(),
        "1".into(),
    ]
}

/// Starts a host with both fixture models on a Unix socket.
fn start_unix(name: &str, extra: &[&str]) -> Host {
    let args: Vec<String> = model_args()
        .into_iter()
        .chain(extra.iter().map(|a| a.to_string()))
        .collect();
    common::start_unix(name, &args)
}

/// Starts a host on TCP port 0 with the test secret, without TLS (TLS is
/// tested with the gateway, `tests/e2e/gpu_host_tls.rs`); the address
/// comes from its stdout.
fn start_tcp(name: &str) -> Host {
    let dir = temp_dir(name);
    let secret_file = dir.join("secret");
    std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
    let mut child = bin()
        .args([
            "serve",
            "--listen",
            "tcp:127.0.0.1:0",
            "--allow-plaintext-tcp",
        ])
        .arg("--auth-token-file")
        .arg(&secret_file)
        .args(model_args())
        .stdout(Stdio::piped())
        .spawn()
        .expect("binary starts");
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

fn text_request(model: &str, prompt: &str, max_tokens: u32) -> v1::GenerateRequest {
    v1::GenerateRequest {
        model: model.into(),
        prompt: Some(Prompt::Text(prompt.into())),
        max_tokens: Some(max_tokens),
        tenant: "test".into(),
        request_id: "r1".into(),
        ..Default::default()
    }
}

/// What one stream produced, with its order checked.
#[derive(Debug)]
struct Streamed {
    prompt_tokens: u32,
    model: String,
    text: String,
    tokens: Vec<u32>,
    reason: FinishReason,
    usage: v1::Usage,
}

async fn run_stream(
    client: &mut GpuHostClient<Channel>,
    req: v1::GenerateRequest,
) -> Result<Streamed, tonic::Status> {
    let mut stream = client.generate(req).await?.into_inner();
    let first = stream.message().await?.expect("a first event");
    let Some(Event::Started(started)) = first.event else {
        panic!("first event is not Started: {first:?}");
    };
    let (mut text, mut tokens) = (String::new(), Vec::new());
    loop {
        let event = stream.message().await?.expect("stream ends with Finished");
        match event.event {
            Some(Event::Delta(d)) => {
                text.push_str(&d.text);
                tokens.extend(d.token_ids);
            }
            Some(Event::Finished(f)) => {
                assert!(stream.message().await?.is_none(), "events after Finished");
                return Ok(Streamed {
                    prompt_tokens: started.prompt_tokens,
                    model: started.model,
                    text,
                    tokens,
                    reason: f.finish_reason(),
                    usage: f.usage.expect("usage"),
                });
            }
            other => panic!("unexpected event {other:?}"),
        }
    }
}

/// `generate --json` for the same model and prompt, greedy.
fn cli_generate(model_file: &str, prompt: &str, max_tokens: u32) -> Value {
    let out = bin()
        .args([
            "generate",
            "--model",
            &model(model_file),
            "--prompt",
            prompt,
        ])
        .args([
            "--max-tokens",
            &max_tokens.to_string(),
            "--threads",
            "1",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test]
async fn streams_match_generate_for_both_models() {
    let mut host = start_unix("both", &[]);
    let mut client = host.client().await;
    for (name, file) in [("llama", "llama-q8_0.gguf"), ("qwen", "qwen2-q4_0.gguf")] {
        let got = run_stream(&mut client, text_request(name, "Once upon a time", 12))
            .await
            .unwrap();
        let want = cli_generate(file, "Once upon a time", 12);
        assert_eq!(got.model, name);
        assert_eq!(got.text, want["text"].as_str().unwrap(), "{name}");
        let want_tokens: Vec<u32> = want["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(got.tokens, want_tokens, "{name}");
        let prompt_len = want["prompt_tokens"].as_array().unwrap().len() as u32;
        assert_eq!(got.prompt_tokens, prompt_len);
        assert_eq!(got.usage.prompt_tokens, prompt_len);
        assert_eq!(got.usage.completion_tokens as usize, got.tokens.len());
        let want_reason = match want["finish_reason"].as_str().unwrap() {
            "stop" => FinishReason::Stop,
            _ => FinishReason::Length,
        };
        assert_eq!(got.reason, want_reason);
    }
}

#[tokio::test]
async fn concurrent_requests_all_complete_correctly() {
    let mut host = start_unix("concurrent", &["--workers", "2"]);
    let client = host.client().await;
    let prompts = ["Hello", "The sky is", "One two three", "Rust is"];
    let mut alone = Vec::new();
    for p in prompts {
        alone.push(
            run_stream(&mut client.clone(), text_request("llama", p, 8))
                .await
                .unwrap(),
        );
    }
    let tasks: Vec<_> = prompts
        .iter()
        .map(|p| {
            let mut c = client.clone();
            let req = text_request("llama", p, 8);
            tokio::spawn(async move { run_stream(&mut c, req).await })
        })
        .collect();
    for (task, want) in tasks.into_iter().zip(alone) {
        let got = task.await.unwrap().unwrap();
        assert_eq!((got.text, got.tokens), (want.text, want.tokens));
        assert_eq!(got.usage.completion_tokens, want.usage.completion_tokens);
    }
}

#[tokio::test]
async fn errors_map_to_grpc_statuses() {
    let mut host = start_unix("errors", &[]);
    let mut client = host.client().await;

    let err = client
        .generate(text_request("nope", "Hi", 4))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(err.message().contains("`nope`"), "{}", err.message());

    let mut bad = text_request("llama", "Hi", 4);
    bad.top_p = Some(1.5);
    let err = client.generate(bad).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("top_p"), "{}", err.message());

    let err = client
        .generate(text_request("llama", "Hi", 1_000_000))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("max_tokens"), "{}", err.message());

    let mut no_prompt = text_request("llama", "Hi", 4);
    no_prompt.prompt = None;
    let err = client.generate(no_prompt).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn a_full_queue_answers_resource_exhausted() {
    let mut host = start_unix("full", &["--workers", "1", "--queue-capacity", "1"]);
    let client = host.client().await;
    // Each takes this model a few hundred milliseconds; all twelve arrive within
    // a few milliseconds, and at most two (one running, one queued) fit at once.
    let tasks: Vec<_> = (0..12)
        .map(|_| {
            let mut c = client.clone();
            tokio::spawn(async move { run_stream(&mut c, text_request("llama", "Hi", 500)).await })
        })
        .collect();
    let (mut done, mut refused) = (0, 0);
    for task in tasks {
        match task.await.unwrap() {
            Ok(s) => {
                assert_eq!(s.usage.completion_tokens as usize, s.tokens.len());
                done += 1;
            }
            Err(e) => {
                assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
                assert!(e.message().contains("queue is full"), "{}", e.message());
                refused += 1;
            }
        }
    }
    assert!(done >= 1 && refused >= 1, "done {done}, refused {refused}");
}

#[tokio::test]
async fn chat_and_token_prompts_work() {
    let mut host = start_unix("prompts", &[]);
    let mut client = host.client().await;
    let mut chat = text_request("qwen", "", 6);
    chat.prompt = Some(Prompt::Chat(v1::ChatMessages {
        messages: vec![v1::ChatMessage {
            role: "user".into(),
            content: "Hello".into(),
        }],
    }));
    let got = run_stream(&mut client, chat).await.unwrap();
    assert!(got.prompt_tokens > 1);
    let mut tokens = text_request("llama", "", 4);
    tokens.prompt = Some(Prompt::Tokens(v1::TokenIds {
        ids: vec![1, 15, 16],
    }));
    let got = run_stream(&mut client, tokens).await.unwrap();
    assert_eq!(got.prompt_tokens, 3);
}

#[tokio::test]
async fn max_tokens_cap_bounds_a_request_without_max_tokens() {
    let mut host = start_unix("cap", &[]);
    let mut client = host.client().await;
    let mut req = text_request("llama", "Once upon a time", 1);
    req.max_tokens = None;
    req.max_tokens_cap = Some(5);
    let got = run_stream(&mut client, req.clone()).await.unwrap();
    assert!(got.tokens.len() <= 5 && !got.tokens.is_empty(), "{got:?}");
    if got.tokens.len() < 5 {
        assert_eq!(got.reason, FinishReason::Stop, "{got:?}");
    }
    // A cap beyond the context is clamped to it, not refused (max_tokens would be).
    req.max_tokens_cap = Some(1_000_000);
    req.stop = vec!["\u{0}never".into()];
    assert!(run_stream(&mut client, req.clone()).await.is_ok());
    req.max_tokens_cap = Some(0);
    let err = run_stream(&mut client, req).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn list_models_and_health() {
    let mut host = start_unix("list", &[]);
    let mut client = host.client().await;
    let models = client
        .list_models(v1::ListModelsRequest {})
        .await
        .unwrap()
        .into_inner()
        .models;
    let names: Vec<(&str, &str)> = models
        .iter()
        .map(|m| (m.name.as_str(), m.architecture.as_str()))
        .collect();
    assert_eq!(names, [("llama", "llama"), ("qwen", "qwen2")]);
    assert!(
        models
            .iter()
            .all(|m| m.context_length > 0 && m.vocab_size > 0)
    );
    let health = client
        .health(v1::HealthRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(health.serving);
    assert_eq!((health.models, health.workers), (2, 1));
    assert_eq!(health.queue_capacity, 64);
}

#[cfg(unix)]
#[tokio::test]
async fn unix_socket_is_private_and_shutdown_drains_streams() {
    use std::os::unix::fs::PermissionsExt;
    let mut host = start_unix("drain", &[]);
    let mut client = host.client().await;
    let Target::Unix(socket) = host.target.clone() else {
        unreachable!()
    };
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);

    // 500 tokens take this model a few hundred milliseconds: still running at SIGTERM.
    let mut stream = client
        .generate(text_request("llama", "Once upon a time", 500))
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert!(matches!(first.event, Some(Event::Started(_))));
    let status = Command::new("kill")
        .args(["-TERM", &host.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let mut tokens = 0;
    let mut usage = None;
    while let Some(event) = stream.message().await.unwrap() {
        match event.event {
            Some(Event::Delta(d)) => tokens += d.token_ids.len(),
            Some(Event::Finished(f)) => usage = f.usage,
            _ => {}
        }
    }
    let usage = usage.expect("the stream in flight ran to Finished");
    assert_eq!(usage.completion_tokens as usize, tokens);
    let exit = host.child.wait().unwrap();
    assert!(exit.success(), "{exit}");
    assert!(!socket.exists(), "socket removed at exit");
}

/// The engine side of cancellation: a callback that breaks stops generation,
/// and pieces carry every generated token (stop-string tokens included).
#[test]
fn streaming_pieces_carry_all_tokens_and_break_cancels() {
    use std::ops::ControlFlow;

    use bulkhead_gpu_host::Tokenizer;
    use bulkhead_gpu_host::backend::CpuBackend;
    use bulkhead_gpu_host::engine::{GenerateError, GenerateRequest, Model, generate_streaming};

    let model = Model::open(model("llama-q8_0.gguf")).unwrap();
    let tokenizer = Tokenizer::from_metadata(model.gguf().metadata()).unwrap();
    let backend = CpuBackend::new(1).unwrap();
    let mut req = GenerateRequest {
        prompt_tokens: tokenizer.encode("Once upon a time", true),
        max_tokens: 40,
        sampling: Default::default(),
        stop: Vec::new(),
    };
    let full = generate_streaming(&model, &tokenizer, &backend, &req, &mut |_| {
        ControlFlow::Continue(())
    })
    .unwrap();

    // Stop at a string from the middle of the output: pieces still carry every token.
    let cut = full
        .text
        .char_indices()
        .nth(full.text.chars().count() / 2)
        .unwrap()
        .0;
    req.stop = vec![full.text[cut..].chars().take(3).collect()];
    let mut tokens = Vec::new();
    let stopped = generate_streaming(&model, &tokenizer, &backend, &req, &mut |p| {
        tokens.extend_from_slice(p.tokens);
        ControlFlow::Continue(())
    })
    .unwrap();
    assert_eq!(tokens, stopped.tokens);

    req.stop.clear();
    let mut pieces = 0;
    let result = generate_streaming(&model, &tokenizer, &backend, &req, &mut |_| {
        pieces += 1;
        ControlFlow::Break(())
    });
    assert!(
        matches!(result, Err(GenerateError::Cancelled)),
        "{result:?}"
    );
    assert_eq!(pieces, 1);
}

#[test]
fn tcp_without_a_secret_refuses_to_start() {
    let out = bin()
        .args([
            "serve",
            "--listen",
            "tcp:127.0.0.1:0",
            "--allow-plaintext-tcp",
        ])
        .args(model_args())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--auth-token-file"), "{stderr}");
}

#[test]
fn tcp_without_tls_refuses_to_start_unless_plaintext_is_asked_for() {
    let dir = temp_dir("notls");
    let secret_file = dir.join("secret");
    std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
    let out = bin()
        .args(["serve", "--listen", "tcp:127.0.0.1:0", "--auth-token-file"])
        .arg(&secret_file)
        .args(model_args())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--tls-cert") && stderr.contains("--allow-plaintext-tcp"),
        "{stderr}"
    );
    // TLS is for TCP: a Unix socket with --tls-cert is refused too.
    let out = bin()
        .args(["serve", "--listen"])
        .arg(format!("unix:{}", dir.join("h.sock").display()))
        .args(["--tls-cert", "/dev/null", "--tls-key", "/dev/null"])
        .args(model_args())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("Unix socket"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn tcp_requires_the_bearer_secret() {
    let mut host = start_tcp("tcp");
    let mut client = host.client().await;

    let err = client.health(v1::HealthRequest {}).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);

    let mut wrong = Request::new(v1::HealthRequest {});
    wrong.metadata_mut().insert(
        AUTHORIZATION,
        bearer_value("correct-horse-battery-staple-0124")
            .parse()
            .unwrap(),
    );
    let err = client.health(wrong).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    assert!(!err.message().contains(SECRET));

    let mut right = Request::new(text_request("llama", "Hi", 3));
    right
        .metadata_mut()
        .insert(AUTHORIZATION, bearer_value(SECRET).parse().unwrap());
    let mut stream = client.generate(right).await.unwrap().into_inner();
    let mut events = 0;
    while let Some(_event) = stream.message().await.unwrap() {
        events += 1;
    }
    assert!(events >= 2);
}

#[tokio::test]
async fn a_tcp_lane_requires_the_bearer_secret_too() {
    let mut host = start_tcp("tcplane");
    let mut client = host.client().await;
    fn authorized<T>(message: T) -> Request<T> {
        let mut request = Request::new(message);
        request
            .metadata_mut()
            .insert(AUTHORIZATION, bearer_value(SECRET).parse().unwrap());
        request
    }
    let tenants = vec![v1::TenantGpu {
        tenant: "a".into(),
        cus: Some(1),
        hbm_bytes: Some(1 << 20),
        isolation: v1::Isolation::Dedicated.into(),
        ..Default::default()
    }];
    let layout = client
        .set_partitions(authorized(v1::SetPartitionsRequest { tenants }))
        .await
        .unwrap()
        .into_inner()
        .layout
        .unwrap();
    let lane = layout
        .partitions
        .iter()
        .find(|p| p.id == "dedicated:a")
        .map(|p| p.lane.clone())
        .unwrap();
    let Ok(Target::Tcp(addr)) = lane.parse() else {
        panic!("lane {lane:?}")
    };
    let Target::Tcp(main) = host.target else {
        unreachable!()
    };
    assert_eq!(addr.ip(), main.ip());
    assert_ne!(addr.port(), main.port());

    let mut lane = GpuHostClient::new(connect(&Target::Tcp(addr)).await.unwrap());
    let err = lane.health(v1::HealthRequest {}).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    let health = lane.health(authorized(v1::HealthRequest {})).await.unwrap();
    assert!(health.into_inner().serving);
}

/// The file, its digests, and a `LoadModel` request for it under `name`.
fn load_request(file: &str, name: &str) -> v1::LoadModelRequest {
    let path = model(file);
    let digest = FileDigest::of(&std::fs::read(&path).unwrap());
    v1::LoadModelRequest {
        name: name.into(),
        path,
        size: digest.size,
        chunk_root: digest.chunk_root.to_vec(),
        sha256: digest.sha256.to_vec(),
        digest: format!("sha256:{}", to_hex(&digest.sha256)),
    }
}

async fn list(client: &mut GpuHostClient<Channel>) -> Vec<v1::ModelInfo> {
    client
        .list_models(v1::ListModelsRequest {})
        .await
        .unwrap()
        .into_inner()
        .models
}

#[tokio::test]
async fn registered_models_load_only_when_every_byte_matches() {
    let mut host = start_unix("load", &[]);
    let mut client = host.client().await;
    let good = load_request("llama-f32.gguf", "registered");
    let refused = |mut change: Box<dyn FnMut(&mut v1::LoadModelRequest)>| {
        let mut req = good.clone();
        change(&mut req);
        req
    };

    let cases: Vec<(v1::LoadModelRequest, Code, &str)> = vec![
        (
            refused(Box::new(|r| r.chunk_root[0] ^= 1)),
            Code::FailedPrecondition,
            "llama-f32.gguf does not match its registration: chunk root",
        ),
        (
            refused(Box::new(|r| {
                r.chunk_root.clear();
                r.sha256[31] ^= 1;
            })),
            Code::FailedPrecondition,
            "does not match its registration: SHA-256",
        ),
        (
            refused(Box::new(|r| r.size -= 1)),
            Code::FailedPrecondition,
            "bytes but was registered as",
        ),
        (
            refused(Box::new(|r| r.path.push_str(".missing"))),
            Code::NotFound,
            "llama-f32.gguf.missing",
        ),
        (
            refused(Box::new(|r| {
                r.chunk_root.clear();
                r.sha256.clear();
            })),
            Code::InvalidArgument,
            "give the file's chunk_root or sha256",
        ),
        (
            refused(Box::new(|r| r.sha256.truncate(31))),
            Code::InvalidArgument,
            "sha256: a SHA-256 digest is 32 bytes, not 31",
        ),
        (
            refused(Box::new(|r| r.name = "llama".into())),
            Code::AlreadyExists,
            "model `llama` is already loaded",
        ),
    ];
    for (req, code, message) in cases {
        let status = client.load_model(req).await.unwrap_err();
        assert_eq!(status.code(), code, "{status:?}");
        assert!(status.message().contains(message), "{status:?}");
    }
    assert!(
        !list(&mut client)
            .await
            .iter()
            .any(|m| m.name == "registered")
    );

    let loaded = client.load_model(good.clone()).await.unwrap().into_inner();
    let info = loaded.model.unwrap();
    assert_eq!(
        (info.name.as_str(), info.digest.as_str()),
        ("registered", good.digest.as_str())
    );
    assert!(info.serving && info.weights_verified_at_unix_ms > 0);

    // It serves, and every generation says which weights answered.
    let mut stream = client
        .generate(text_request("registered", "Hello", 4))
        .await
        .unwrap()
        .into_inner();
    let Some(Event::Started(started)) = stream.message().await.unwrap().unwrap().event else {
        panic!("no Started");
    };
    assert_eq!(started.model_digest, good.digest);
    assert_eq!(
        started.weights_verified_at_unix_ms,
        info.weights_verified_at_unix_ms
    );
    drop(stream);

    // Models from the command line are hashed too, and say so.
    let llama = list(&mut client)
        .await
        .into_iter()
        .find(|m| m.name == "llama")
        .unwrap();
    let expected = FileDigest::of(&std::fs::read(model("llama-q8_0.gguf")).unwrap());
    assert_eq!(
        llama.digest,
        format!("chunks-sha256:{}", to_hex(&expected.chunk_root))
    );

    client
        .unload_model(v1::UnloadModelRequest {
            name: "registered".into(),
        })
        .await
        .unwrap();
    let status = run_stream(&mut client, text_request("registered", "Hi", 1))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    let status = client
        .unload_model(v1::UnloadModelRequest {
            name: "registered".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);

    // The test hook is off unless asked for.
    let status = client
        .corrupt_resident_weights(v1::CorruptResidentWeightsRequest {
            model: "llama".into(),
            offset: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
}

#[tokio::test]
async fn a_flipped_resident_bit_takes_only_that_model_out_of_service() {
    let mut host = start_unix(
        "scrub",
        &["--enable-test-hooks", "--scrub-bytes-per-s", "1000000000"],
    );
    let mut client = host.client().await;
    run_stream(&mut client, text_request("llama", "Hello", 2))
        .await
        .unwrap();
    let size = std::fs::metadata(model("llama-q8_0.gguf")).unwrap().len();
    client
        .corrupt_resident_weights(v1::CorruptResidentWeightsRequest {
            model: "llama".into(),
            offset: size / 2,
        })
        .await
        .unwrap();
    // The scrub re-reads 1 GB/s: it finds the flip within one pass.
    let deadline = Instant::now() + Duration::from_secs(30);
    let llama = loop {
        let llama = list(&mut client)
            .await
            .into_iter()
            .find(|m| m.name == "llama")
            .unwrap();
        if !llama.serving {
            break llama;
        }
        assert!(
            Instant::now() < deadline,
            "the scrub never noticed: {llama:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        llama
            .unavailable_reason
            .contains("weights changed while resident: chunk "),
        "{llama:?}"
    );
    let status = run_stream(&mut client, text_request("llama", "Hello", 2))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(
        status.message().contains("model `llama` is out of service"),
        "{status:?}"
    );
    // The other model's weights are intact and it keeps serving. The scrub
    // (an idle-priority thread) may not have reached them yet on a busy
    // machine: wait until it has, then they must still be serving.
    run_stream(&mut client, text_request("qwen", "Hello", 2))
        .await
        .unwrap();
    let qwen = loop {
        let qwen = list(&mut client)
            .await
            .into_iter()
            .find(|m| m.name == "qwen")
            .unwrap();
        if qwen.scrubbed_bytes > 0 {
            break qwen;
        }
        assert!(
            Instant::now() < deadline,
            "the scrub never reached qwen: {qwen:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(qwen.serving, "{qwen:?}");
    // The floor's share is part of the scrubbed bytes.
    assert!(qwen.scrub_floor_bytes <= qwen.scrubbed_bytes);
}
