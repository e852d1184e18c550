//! Chat templates must render exactly as transformers renders them.
//!
//! Fixtures: `tests/fixtures/chat/<name>.json`.

use std::path::PathBuf;

use bulkhead_gpu_host::{ChatMessage, ChatTemplate};
use serde::Deserialize;

const NAMES: &[&str] = &["llama3", "qwen2", "gemma", "phi3"];

#[derive(Deserialize)]
struct Fixture {
    name: String,
    template: String,
    /// `null` when the model has none (Qwen2 has no BOS).
    bos_token: Option<String>,
    eos_token: Option<String>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    messages: Vec<ChatMessage>,
    add_generation_prompt: bool,
    rendered: String,
}

#[test]
fn matches_transformers_on_fixtures() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/chat");
    let mut failures = Vec::new();
    for name in NAMES {
        let path = dir.join(format!("{name}.json"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!("{}: {e} (regenerate with tests/reference)", path.display())
        });
        let fixture: Fixture = serde_json::from_str(&text).expect("fixture JSON parses");
        assert_eq!(fixture.name, *name);
        let template = ChatTemplate::new(
            Some(&fixture.template),
            fixture.bos_token.as_deref().unwrap_or(""),
            fixture.eos_token.as_deref().unwrap_or(""),
        )
        .expect("template compiles");
        let mut passed = 0;
        for (i, case) in fixture.cases.iter().enumerate() {
            match template.render(&case.messages, case.add_generation_prompt) {
                Ok(out) if out == case.rendered => passed += 1,
                Ok(out) => failures.push(format!(
                    "{name} case {i}: got {out:?}, want {:?}",
                    case.rendered
                )),
                Err(e) => failures.push(format!("{name} case {i}: {e}")),
            }
        }
        eprintln!("{name}: {passed} of {} cases pass", fixture.cases.len());
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
