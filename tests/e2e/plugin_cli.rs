//! `bulkhead plugin check` and `bulkhead plugin run`, as plugin authors use
//! them, on the guest SDK's example plugins.

use std::path::PathBuf;
use std::process::{Command, Output};

use bulkhead_testkit::wasm;
use bulkhead_tests::bin;
use serde_json::Value;

/// A scratch folder with the files a run needs.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("bulkhead-cli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn file(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn bulkhead(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(bin("bulkhead"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("bulkhead runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn check_accepts_a_plugin_and_names_what_is_wrong_with_anything_else() {
    let scratch = Scratch::new("check");
    let pii = scratch.file("pii-redact.wasm", &wasm::example("pii-redact"));
    let out = bulkhead(&["plugin".as_ref(), "check".as_ref(), pii.as_os_str()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("a valid plugin"), "{stdout}");
    assert!(stdout.contains("sha256:"), "{stdout}");
    assert!(
        stdout.contains("imports bulkhead:plugin/host@0.1.0"),
        "{stdout}"
    );

    // A core module (the smallest valid one) and garbage.
    let core = scratch.file("core.wasm", b"\0asm\x01\0\0\0");
    let out = bulkhead(&["plugin".as_ref(), "check".as_ref(), core.as_os_str()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("not a component"),
        "{}",
        text(&out.stderr)
    );
    let garbage = scratch.file("garbage.wasm", b"hello");
    let out = bulkhead(&["plugin".as_ref(), "check".as_ref(), garbage.as_os_str()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("plugin_malformed"),
        "{}",
        text(&out.stderr)
    );
    let missing = scratch.0.join("nope.wasm");
    let out = bulkhead(&["plugin".as_ref(), "check".as_ref(), missing.as_os_str()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("nope.wasm"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn run_prints_the_rewritten_request_and_response_and_reports_rejections() {
    let scratch = Scratch::new("run");
    let pii = scratch.file("pii-redact.wasm", &wasm::example("pii-redact"));
    let guard = scratch.file("prompt-guard.wasm", &wasm::example("prompt-guard"));
    let request = scratch.file(
        "req.json",
        br#"{"model": "m", "messages": [{"role": "user", "content": "Mail ana@example.com"}], "max_tokens": 5}"#,
    );
    let response = scratch.file(
        "resp.json",
        br#"{"id": "x", "object": "chat.completion", "model": "m",
             "choices": [{"index": 0, "message": {"role": "assistant", "content": "Call +1 415 555 0100 now"}, "finish_reason": "stop"}],
             "usage": {"prompt_tokens": 3, "completion_tokens": 6, "total_tokens": 9}}"#,
    );

    let out = bulkhead(&[
        "plugin".as_ref(),
        "run".as_ref(),
        pii.as_os_str(),
        "--request".as_ref(),
        request.as_os_str(),
        "--response".as_ref(),
        response.as_os_str(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["request"]["messages"][0]["content"], "Mail [email]");
    assert_eq!(result["request"]["max_completion_tokens"], 5);
    assert_eq!(
        result["response"]["choices"][0]["message"]["content"],
        "Call [phone] now"
    );
    assert_eq!(result["response"]["usage"]["completion_tokens"], 6);
    let stderr = text(&out.stderr);
    assert!(stderr.contains("on-request: "), "{stderr}");
    assert!(stderr.contains("on-response: "), "{stderr}");
    assert!(stderr.contains("memory: "), "{stderr}");

    // The stream hooks over the same text in 3-character pieces: a number
    // split across pieces is still redacted.
    let out = bulkhead(&[
        "plugin".as_ref(),
        "run".as_ref(),
        pii.as_os_str(),
        "--request".as_ref(),
        request.as_os_str(),
        "--response".as_ref(),
        response.as_os_str(),
        "--chunk-chars".as_ref(),
        "3".as_ref(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        result["response"]["choices"][0]["message"]["content"],
        "Call [phone] now"
    );
    assert!(text(&out.stderr).contains("on-chunk: "));

    // A rejection: exit status 3 and the plugin's status and message.
    let out = bulkhead(&[
        "plugin".as_ref(),
        "run".as_ref(),
        guard.as_os_str(),
        "--request".as_ref(),
        request.as_os_str(),
        "--config".as_ref(),
        "blocked=ana@example.com".as_ref(),
        "--config".as_ref(),
        "message=No addresses.".as_ref(),
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["rejected"]["hook"], "on-request");
    assert_eq!(result["rejected"]["status"], 400);
    assert_eq!(result["rejected"]["message"], "No addresses.");

    // Bad input files are named.
    let bad = scratch.file("bad.json", b"{\"model\": \"m\"}");
    let out = bulkhead(&[
        "plugin".as_ref(),
        "run".as_ref(),
        pii.as_os_str(),
        "--request".as_ref(),
        bad.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("the request file"),
        "{}",
        text(&out.stderr)
    );
}
