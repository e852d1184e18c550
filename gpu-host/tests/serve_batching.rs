//! `serve` with continuous batching: KV admission over gRPC, many streams
//! in one batch, and the load numbers in `Health`.

use bulkhead_protocol::v1::generate_event::Event;
use bulkhead_protocol::v1::generate_request::Prompt;
mod common;

use bulkhead_protocol::v1;
use bulkhead_protocol::v1::gpu_host_client::GpuHostClient;
use common::{Host, model, start_unix};
use tonic::Code;
use tonic::transport::Channel;

/// A host with the llama fixture on one core, and `extra` arguments.
fn start(name: &str, extra: &[&str]) -> Host {
    let llama = format!("llama={}", model("llama-q8_0.gguf"));
    let args: Vec<&str> = ["--model", &llama, "--threads", "1"]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    start_unix(name, &args)
}

fn request(tenant: &str, prompt: &str, max_tokens: u32) -> v1::GenerateRequest {
    v1::GenerateRequest {
        model: "llama".into(),
        prompt: Some(Prompt::Text(prompt.into())),
        max_tokens: Some(max_tokens),
        tenant: tenant.into(),
        ..Default::default()
    }
}

/// Text and token count of a stream run to its end.
async fn run(
    client: &mut GpuHostClient<Channel>,
    req: v1::GenerateRequest,
) -> Result<(String, usize), tonic::Status> {
    let mut stream = client.generate(req).await?.into_inner();
    let (mut text, mut tokens) = (String::new(), 0);
    while let Some(event) = stream.message().await? {
        if let Some(Event::Delta(d)) = event.event {
            text.push_str(&d.text);
            tokens += d.token_ids.len();
        }
    }
    Ok((text, tokens))
}

/// 256 KiB of KV for this model (2 layers × 2 KV heads × 64 × f32 × K,V =
/// 2 KiB a token) is 8 blocks of 16 tokens: 128 tokens.
#[tokio::test]
async fn a_request_that_cannot_fit_the_kv_cache_is_refused_with_the_numbers() {
    let mut host = start("kv", &["--kv-memory", "256KiB"]);
    let mut client = host.client().await;
    let err = run(&mut client, request("acme", "Hello", 200))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    assert!(
        err.message().starts_with("kv_budget_exceeded:"),
        "{}",
        err.message()
    );
    assert!(err.message().contains("has 128 "), "{}", err.message());
    let (_, tokens) = run(&mut client, request("acme", "Hello", 20))
        .await
        .unwrap();
    assert!(tokens > 0);
}

#[tokio::test]
async fn many_streams_share_one_batch_and_health_counts_them() {
    let mut host = start("many", &["--max-batch", "8"]);
    let client = host.client().await;
    let alone = run(&mut client.clone(), request("a", "Once upon a time", 24))
        .await
        .unwrap();
    let tasks: Vec<_> = (0..12)
        .map(|i| {
            let mut c = client.clone();
            let tenant = if i % 2 == 0 { "a" } else { "b" };
            tokio::spawn(async move { run(&mut c, request(tenant, "Once upon a time", 24)).await })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap(), alone);
    }
    let health = client
        .clone()
        .health(v1::HealthRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!((health.workers, health.max_running), (1, 8));
    assert_eq!((health.queued, health.running), (0, 0));

    // Batching itself: twelve long streams all produce their first token
    // before any is done, and the host runs them at once. A server that
    // ran one generation at a time could not give the second stream a
    // token before the first's 400 were done, and would count one running.
    let mut streams = Vec::new();
    for i in 0..12 {
        let tenant = if i % 2 == 0 { "a" } else { "b" };
        let mut c = client.clone();
        let stream = c
            .generate(request(tenant, "Once upon a time", 400))
            .await
            .unwrap();
        streams.push(stream.into_inner());
    }
    for stream in &mut streams {
        loop {
            match stream.message().await.unwrap().and_then(|e| e.event) {
                Some(Event::Delta(_)) => break,
                Some(Event::Finished(_)) | None => panic!("a stream ended before its first token"),
                Some(_) => {}
            }
        }
    }
    let health = client
        .clone()
        .health(v1::HealthRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(
        health.running >= 2,
        "{} sequences running with twelve streams open",
        health.running
    );
}
