//! The `bulkhead-gpu-host` command-line tools, run as a user runs them.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_bulkhead-gpu-host"))
}

fn model(name: &str) -> String {
    fixtures().join("models").join(name).display().to_string()
}

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("binary runs")
}

fn ok_json(args: &[&str]) -> Value {
    let out = run(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON value")
}

fn failure(args: &[&str]) -> String {
    let out = run(args);
    assert!(!out.status.success(), "{args:?} unexpectedly succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("bulkhead-cli-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn generate_json_reports_tokens_text_and_timings() {
    let m = model("llama-q8_0.gguf");
    let v = ok_json(&[
        "generate",
        "--model",
        &m,
        "--prompt",
        "Hello world",
        "--max-tokens",
        "12",
        "--threads",
        "2",
        "--json",
    ]);
    let tokens = v["tokens"].as_array().unwrap();
    assert!(!tokens.is_empty() && tokens.len() <= 12);
    let prompt = ok_json(&["tokenize", "--model", &m, "--text", "Hello world"]);
    assert_eq!(v["prompt_tokens"], prompt);
    assert!(v["text"].is_string());
    for key in ["prompt_ms", "decode_ms", "prompt_tok_s", "decode_tok_s"] {
        assert!(v["timings"][key].as_f64().unwrap() >= 0.0, "{key}");
    }
    if tokens.len() == 12 {
        assert_eq!(v["finish_reason"], "length");
    }
}

#[test]
fn streaming_text_equals_json_text() {
    let m = model("qwen2-q4_0.gguf");
    let args = [
        "generate",
        "--model",
        &m,
        "--prompt",
        "The sea",
        "--max-tokens",
        "16",
    ];
    let streamed = run(&args);
    assert!(streamed.status.success());
    let mut json_args = args.to_vec();
    json_args.push("--json");
    let v = ok_json(&json_args);
    let text = String::from_utf8(streamed.stdout).unwrap();
    assert_eq!(
        text.strip_suffix('\n').unwrap(),
        v["text"].as_str().unwrap()
    );
}

#[test]
fn same_seed_same_output_different_seed_differs() {
    let m = model("llama-q4_k_m.gguf");
    let sample = |seed: &str| {
        ok_json(&[
            "generate",
            "--model",
            &m,
            "--prompt",
            "A",
            "--max-tokens",
            "24",
            "--temperature",
            "1.5",
            "--seed",
            seed,
            "--json",
        ])["tokens"]
            .clone()
    };
    assert_eq!(sample("7"), sample("7"));
    assert_ne!(sample("7"), sample("8"));
}

#[test]
fn stop_string_cuts_the_output() {
    let m = model("llama-f16.gguf");
    let full = ok_json(&[
        "generate",
        "--model",
        &m,
        "--prompt",
        "x",
        "--max-tokens",
        "24",
        "--json",
    ]);
    let text = full["text"].as_str().unwrap();
    // Stop at a piece of the greedy output itself.
    let chars: Vec<char> = text.chars().collect();
    assert!(chars.len() > 6, "output too short to test stop: {text:?}");
    let stop: String = chars[4..6].iter().collect();
    let cut = ok_json(&[
        "generate",
        "--model",
        &m,
        "--prompt",
        "x",
        "--max-tokens",
        "24",
        "--stop",
        &stop,
        "--json",
    ]);
    let expected = &text[..text.find(&stop).unwrap()];
    assert_eq!(cut["text"].as_str().unwrap(), expected);
    assert_eq!(cut["finish_reason"], "stop");
}

#[test]
fn chat_file_is_rendered_with_the_model_template() {
    let dir = temp_dir("chat");
    let chat = dir.join("chat.json");
    std::fs::write(
        &chat,
        r#"{"messages": [{"role": "user", "content": "Hi there"}]}"#,
    )
    .unwrap();
    let m = model("qwen2-q8_0.gguf");
    let v = ok_json(&[
        "generate",
        "--model",
        &m,
        "--chat",
        chat.to_str().unwrap(),
        "--max-tokens",
        "4",
        "--json",
    ]);
    let prompt: Vec<u64> = v["prompt_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    // The rendered prompt starts with <|im_start|> as one special token.
    let im_start = ok_json(&["tokenize", "--model", &m, "--text", "<|im_start|>"]);
    assert_eq!(prompt[0], im_start[0].as_u64().unwrap());

    std::fs::write(&chat, "{not json").unwrap();
    let err = failure(&["generate", "--model", &m, "--chat", chat.to_str().unwrap()]);
    assert!(err.contains("chat.json"), "{err}");
    std::fs::write(&chat, "[]").unwrap();
    let err = failure(&["generate", "--model", &m, "--chat", chat.to_str().unwrap()]);
    assert!(err.contains("no messages"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--backend emulated`: the HIP backend on the kernel emulator gives the
/// CPU's tokens, and `--json` says what the device was asked for: the load
/// (weights up, nothing launched), each prefill chunk and the decode steps.
#[test]
fn generate_on_the_emulator_reports_what_the_device_moved() {
    let m = model("llama-q8_0.gguf");
    let args = |backend: &'static str| {
        [
            "generate",
            "--model",
            &m,
            "--prompt",
            "Hi",
            "--max-tokens",
            "2",
            "--threads",
            "2",
            "--backend",
            backend,
            "--json",
        ]
        .map(str::to_owned)
    };
    let cpu = ok_json(&args("cpu").each_ref().map(String::as_str));
    assert!(cpu.get("device").is_none(), "the CPU moves nothing: {cpu}");
    let out = run(&args("emulated").each_ref().map(String::as_str));
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("no C++ compiler") {
        bulkhead_testkit::skip(bulkhead_testkit::Need::Cxx, stderr.trim());
        return;
    }
    assert!(out.status.success(), "{stderr}");
    let emulated: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(emulated["tokens"], cpu["tokens"]);
    let device = &emulated["device"];
    assert!(
        device["backend"].as_str().unwrap().contains("emulator"),
        "{device}"
    );
    let load = &device["load"];
    let file_bytes = std::fs::metadata(&m).unwrap().len();
    let uploaded = load["host_to_device_bytes"].as_u64().unwrap();
    assert!(
        uploaded > file_bytes * 9 / 10 && uploaded <= file_bytes,
        "{load}"
    );
    assert_eq!(
        (
            load["launches"].as_u64(),
            load["device_to_host_bytes"].as_u64()
        ),
        (Some(0), Some(0))
    );
    let prompt = emulated["prompt_tokens"].as_array().unwrap().len() as u64;
    let chunks = device["prefill_chunks"].as_array().unwrap();
    assert_eq!(chunks.len(), 1, "{device}");
    assert_eq!(chunks[0]["tokens"].as_u64(), Some(prompt));
    let decode = &device["decode_steps"];
    let generated = emulated["tokens"].as_array().unwrap().len() as u64;
    assert_eq!(
        decode["count"].as_u64(),
        Some(generated - 1),
        "the last token needs no pass"
    );
    let vocab = device["vocab_size"].as_u64().unwrap();
    for stat in ["median", "max"] {
        let step = &decode[stat];
        let count = |name: &str| step[name].as_u64().unwrap();
        assert!(count("launches") > 0, "{decode}");
        // In: the token id and its position (the cache's block table was
        // sent with the prompt). Out: the logits. One wait, no allocation.
        assert!(count("host_to_device_bytes") <= 64, "{decode}");
        assert_eq!(count("device_to_host_bytes"), vocab * 4, "{decode}");
        assert_eq!(count("synchronizations"), 1, "{decode}");
        assert_eq!((count("allocations"), count("frees")), (0, 0), "{decode}");
    }
}

/// `eval --backend emulated` gives the CPU's logits on the F32 fixtures
/// of both families, within 1e-4 of the largest logit.
#[test]
fn eval_on_the_emulator_gives_the_cpus_logits() {
    for name in ["llama-f32.gguf", "qwen2-f32.gguf"] {
        let m = model(name);
        let args = |backend: &'static str| {
            [
                "eval",
                "--model",
                &m,
                "--prompt",
                "one two three",
                "--backend",
                backend,
                "--json",
            ]
            .map(str::to_owned)
        };
        let out = run(&args("emulated").each_ref().map(String::as_str));
        let stderr = String::from_utf8_lossy(&out.stderr);
        if stderr.contains("no C++ compiler") {
            bulkhead_testkit::skip(bulkhead_testkit::Need::Cxx, stderr.trim());
            return;
        }
        assert!(out.status.success(), "{stderr}");
        let emulated: Value = serde_json::from_slice(&out.stdout).unwrap();
        let cpu = ok_json(&args("cpu").each_ref().map(String::as_str));
        assert_eq!(emulated["tokens"], cpu["tokens"]);
        let floats = |v: &Value| -> Vec<f64> {
            v["logits"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|row| row.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()))
                .collect()
        };
        let (got, want) = (floats(&emulated), floats(&cpu));
        assert_eq!(got.len(), want.len());
        let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        let worst = got
            .iter()
            .zip(&want)
            .fold(0.0f64, |m, (g, w)| m.max((g - w).abs()));
        assert!(
            worst / scale < 1e-4,
            "{name}: max |Δ| {worst:.3e} of {scale:.3e}"
        );
    }
}

/// A mixture-of-experts model runs on the CPU; the device backend (here
/// on the emulator) refuses it before the first pass, naming the
/// architecture and the op it lacks.
#[test]
fn a_mixture_of_experts_runs_on_the_cpu_and_is_refused_by_the_device() {
    let m = model("mixtral-q8_0.gguf");
    let args = |backend: &'static str| {
        [
            "generate",
            "--model",
            &m,
            "--prompt",
            "Hi",
            "--max-tokens",
            "3",
            "--threads",
            "2",
            "--backend",
            backend,
            "--json",
        ]
        .map(str::to_owned)
    };
    let cpu = ok_json(&args("cpu").each_ref().map(String::as_str));
    let generated = cpu["tokens"].as_array().map_or(0, Vec::len);
    assert!((1..=3).contains(&generated), "{cpu}");
    let err = failure(&args("emulated").each_ref().map(String::as_str));
    if err.contains("no C++ compiler") {
        bulkhead_testkit::skip(bulkhead_testkit::Need::Cxx, err.trim());
        return;
    }
    for part in ["llama", "mixture of experts", "moe_ffn", "GPU"] {
        assert!(err.contains(part), "{err}");
    }
}

#[test]
fn eval_prints_one_logit_row_per_token() {
    let m = model("qwen2-f16.gguf");
    let v = ok_json(&["eval", "--model", &m, "--prompt", "one two three", "--json"]);
    let tokens = v["tokens"].as_array().unwrap();
    let rows = v["logits"].as_array().unwrap();
    assert_eq!(rows.len(), tokens.len());
    let vocab = rows[0].as_array().unwrap().len();
    assert!(vocab > 256);
    assert!(rows.iter().all(|r| r.as_array().unwrap().len() == vocab));
}

#[test]
fn inspect_shows_architecture_metadata_and_tensors() {
    let out = run(&["inspect", "--model", &model("qwen2-q4_k_m.gguf")]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("architecture: qwen2"), "{text}");
    assert!(text.contains("tokenizer.ggml.model"), "{text}");
    assert!(text.contains("blk.0.attn_q.bias"), "{text}");
    assert!(text.contains("Q4_K"), "{text}");
}

#[test]
fn bad_inputs_fail_with_clear_errors() {
    let err = failure(&[
        "generate",
        "--model",
        "/nonexistent/m.gguf",
        "--prompt",
        "x",
    ]);
    assert!(err.contains("/nonexistent/m.gguf"), "{err}");

    let dir = temp_dir("bad");
    let truncated = dir.join("truncated.gguf");
    let bytes = std::fs::read(fixtures().join("models/llama-q4_0.gguf")).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let err = failure(&[
        "generate",
        "--model",
        truncated.to_str().unwrap(),
        "--prompt",
        "x",
    ]);
    assert!(err.contains("outside the file"), "{err}");

    let not_gguf = dir.join("text.gguf");
    std::fs::write(&not_gguf, "hello, I am not a model").unwrap();
    let err = failure(&["inspect", "--model", not_gguf.to_str().unwrap()]);
    assert!(err.contains("not a GGUF file"), "{err}");

    let m = model("llama-q8_0.gguf");
    let err = failure(&["generate", "--model", &m, "--prompt", "x", "--top-p", "0"]);
    assert!(err.contains("top_p"), "{err}");
    let err = failure(&[
        "generate",
        "--model",
        &m,
        "--prompt",
        "x",
        "--max-tokens",
        "100000000",
    ]);
    assert!(err.contains("context length"), "{err}");
    let err = failure(&[
        "generate", "--model", &m, "--prompt", "x", "--chat", "c.json",
    ]);
    assert!(err.contains("cannot be used with"), "{err}");
    let err = failure(&["generate", "--model", &m, "--prompt", "x", "--threads", "0"]);
    assert!(err.contains("thread"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_scrub_floor_above_its_rate_is_refused_naming_both() {
    let err = failure(&[
        "serve",
        "--listen",
        "unix:/nonexistent/never-bound.sock",
        "--scrub-bytes-per-s",
        "1000",
        "--scrub-min-bytes-per-s",
        "2000",
    ]);
    assert!(
        err.contains("--scrub-min-bytes-per-s 2000 is above --scrub-bytes-per-s 1000"),
        "{err}"
    );
}

#[test]
fn bench_reports_warm_prefill_and_decode_rates() {
    let m = model("llama-q8_0.gguf");
    let v = ok_json(&[
        "bench",
        "--model",
        &m,
        "--prompt-tokens",
        "24",
        "--gen-tokens",
        "8",
        "--repetitions",
        "3",
        "--threads",
        "2",
        "--json",
    ]);
    assert_eq!(v["prompt_tokens"], 24);
    assert_eq!(v["gen_tokens"], 8);
    for key in ["prefill_samples_tok_s", "decode_samples_tok_s"] {
        let samples = v[key].as_array().unwrap();
        assert_eq!(samples.len(), 3, "{key}: {v}");
        assert!(
            samples.iter().all(|s| s.as_f64().unwrap() > 0.0),
            "{key}: {v}"
        );
    }
    // The rates are the medians of the samples.
    for (rate, samples) in [
        ("prefill_tok_s", "prefill_samples_tok_s"),
        ("decode_tok_s", "decode_samples_tok_s"),
    ] {
        let mut s: Vec<f64> = v[samples]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        s.sort_by(f64::total_cmp);
        assert_eq!(v[rate].as_f64().unwrap(), s[1], "{v}");
    }
    assert!(v["backend"].as_str().unwrap().contains("cpu"), "{v}");

    // Prefill only.
    let v = ok_json(&[
        "bench",
        "--model",
        &m,
        "--prompt-tokens",
        "8",
        "--gen-tokens",
        "0",
        "--repetitions",
        "1",
        "--json",
    ]);
    assert_eq!(v["decode_tok_s"], 0.0);
    assert!(v["prefill_tok_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn bench_refuses_what_it_cannot_measure() {
    let m = model("llama-q8_0.gguf");
    let err = failure(&["bench", "--model", &m, "--prompt-tokens", "0"]);
    assert!(err.contains("--prompt-tokens must be"), "{err}");
    let err = failure(&["bench", "--model", &m, "--repetitions", "0"]);
    assert!(err.contains("--repetitions must be"), "{err}");
    // The fixture's context is 512 positions.
    let err = failure(&[
        "bench",
        "--model",
        &m,
        "--prompt-tokens",
        "500",
        "--gen-tokens",
        "100",
    ]);
    assert!(err.contains("exceed the model's context of 512"), "{err}");
    let err = failure(&["bench", "--model", "/nonexistent.gguf"]);
    assert!(err.contains("/nonexistent.gguf"), "{err}");
}
