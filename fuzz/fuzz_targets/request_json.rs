//! Feeds arbitrary bytes as an OpenAI request body to `InferenceRequest::parse`,
//! on both endpoints: it must return a request or a 400 `ApiError`, never panic,
//! and an accepted request must satisfy the limits the parser promises (its
//! prompt bound computed without overflow).
#![no_main]

use bulkhead_gateway::{Endpoint, InferenceRequest, Prompt};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|body: &[u8]| {
    for endpoint in [Endpoint::Chat, Endpoint::Completion] {
        match InferenceRequest::parse(endpoint, body) {
            Ok(request) => check_accepted(&request, endpoint, body),
            Err(error) => {
                // A body is the caller's fault: never a 5xx.
                assert_eq!(error.status.as_u16(), 400, "{error:?}");
                assert!(!error.message.is_empty());
                // The error JSON renders.
                let _ = error.body().to_string();
            }
        }
    }
});

fn check_accepted(request: &InferenceRequest, endpoint: Endpoint, body: &[u8]) {
    assert_eq!(request.endpoint, endpoint);
    assert_ne!(request.max_tokens, Some(0));
    assert!((0.0..=2.0).contains(&request.temperature));
    assert!(request.top_p > 0.0 && request.top_p <= 1.0);
    assert!(request.min_p.is_none_or(|p| (0.0..=1.0).contains(&p)));
    assert!(
        request
            .repetition_penalty
            .is_none_or(|p| (0.01..=10.0).contains(&p))
    );
    assert!(request.stop.len() <= 4);
    assert!(request.stop.iter().all(|s| (1..=256).contains(&s.len())));

    let bound = request.prompt_token_bound();
    match (&request.prompt, endpoint) {
        (Prompt::Chat(messages), Endpoint::Chat) => {
            assert!((1..=4096).contains(&messages.len()));
            let bytes: u64 = messages
                .iter()
                .map(|(role, content)| {
                    assert!(matches!(role.as_str(), "system" | "user" | "assistant"));
                    (role.len() + content.len()) as u64
                })
                .sum();
            // At least one token per byte of every message.
            assert!(bound >= bytes, "bound {bound} < {bytes} bytes");
        }
        (Prompt::Text(text), Endpoint::Completion) => {
            assert!(bound >= text.len() as u64);
        }
        (Prompt::Tokens(ids), Endpoint::Completion) => {
            assert!(!ids.is_empty());
            assert_eq!(bound, ids.len() as u64);
        }
        (prompt, endpoint) => panic!("{endpoint:?} accepted a {prompt:?} prompt"),
    }
    // Everything accepted came from the body: the bound is not inflated by
    // more than the per-message and fixed overheads.
    assert!(bound <= body.len() as u64 * 17 + 32, "bound {bound}");
}
