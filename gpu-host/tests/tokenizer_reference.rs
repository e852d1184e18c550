//! Tokenizers built from GGUF fixtures must reproduce Hugging Face
//! `tokenizers` ids and decoded text for every recorded case.
//!
//! Fixtures: `tests/fixtures/tokenizers/<kind>.gguf` + `<kind>.json`.

use std::path::PathBuf;

use bulkhead_gpu_host::Tokenizer;
use bulkhead_gpu_host::gguf::Gguf;
use serde::Deserialize;

/// `gemma` and `phi3` come from `tests/reference/make_families.py`, their
/// GGUFs written by llama.cpp's `convert_hf_to_gguf.py`.
const KINDS: &[&str] = &["spm", "gpt2", "llama3", "qwen2", "gemma", "phi3"];

/// Cases known to disagree with HF, with the reason. They must still fail
/// (so this list cannot go stale); everything else must match exactly.
const KNOWN_GAPS: &[(&str, usize, &str)] = &[];

#[derive(Deserialize)]
struct Fixture {
    kind: String,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    text: String,
    ids_with_special: Vec<u32>,
    ids_no_special: Vec<u32>,
    decoded: String,
}

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tokenizers")
}

/// Checks every case of one kind; returns the case count and the failures.
fn check_kind(kind: &str) -> (usize, Vec<String>) {
    let dir = fixture_dir();
    let json = dir.join(format!("{kind}.json"));
    let text = std::fs::read_to_string(&json)
        .unwrap_or_else(|e| panic!("{}: {e} (regenerate with tests/reference)", json.display()));
    let fixture: Fixture = serde_json::from_str(&text).expect("fixture JSON parses");
    assert_eq!(fixture.kind, kind);
    let gguf = Gguf::open(dir.join(format!("{kind}.gguf"))).expect("fixture GGUF opens");
    let tok = Tokenizer::from_metadata(gguf.metadata()).expect("tokenizer builds");
    let mut failures = Vec::new();
    for (i, case) in fixture.cases.iter().enumerate() {
        if let Some((_, _, why)) = KNOWN_GAPS.iter().find(|g| g.0 == kind && g.1 == i) {
            let matches = tok.encode(&case.text, false) == case.ids_no_special;
            if matches {
                failures.push(format!(
                    "{kind} case {i} now matches; drop it from KNOWN_GAPS"
                ));
            } else {
                eprintln!("{kind} case {i}: known gap ({why})");
            }
            continue;
        }
        let with = tok.encode(&case.text, true);
        if with != case.ids_with_special {
            failures.push(format!(
                "{kind} case {i} {:?}: with special: got {with:?}, want {:?}",
                case.text, case.ids_with_special
            ));
        }
        let without = tok.encode(&case.text, false);
        if without != case.ids_no_special {
            failures.push(format!(
                "{kind} case {i} {:?}: no special: got {without:?}, want {:?}",
                case.text, case.ids_no_special
            ));
        }
        // The fixture's `decoded` is HF's decode(ids_no_special, skip_special_tokens=False).
        let decoded = tok.decode(&case.ids_no_special);
        if decoded != case.decoded {
            failures.push(format!(
                "{kind} case {i} {:?}: decode: got {decoded:?}, want {:?}",
                case.text, case.decoded
            ));
        }
        let mut stream = tok.stream_decoder();
        let mut streamed: String = case
            .ids_no_special
            .iter()
            .map(|&id| stream.push(id))
            .collect();
        streamed.push_str(&stream.finish());
        if streamed != decoded {
            failures.push(format!(
                "{kind} case {i}: stream decode differs from decode"
            ));
        }
    }
    (fixture.cases.len(), failures)
}

#[test]
fn matches_hugging_face_on_fixtures() {
    let mut all_failures = Vec::new();
    for kind in KINDS {
        let (cases, failures) = check_kind(kind);
        assert!(cases >= 40, "{kind}: only {cases} cases in the fixture");
        eprintln!("{kind}: {cases} cases, {} mismatches", failures.len());
        all_failures.extend(failures);
    }
    assert!(
        all_failures.is_empty(),
        "{} mismatches:\n{}",
        all_failures.len(),
        all_failures.join("\n")
    );
}

/// Where llama.cpp's ids differ from Hugging Face's (the README's list in
/// tests/reference: SentencePiece's leading space, Qwen2's NFC), the
/// fixture records them; everywhere else the two agree, so matching HF
/// there is matching llama.cpp.
const LLAMACPP_DIFFERS: &[(&str, &[&str])] = &[
    (
        "spm",
        &[
            " ",
            "  ",
            "   leading spaces",
            " \n \n\n \t\t \n",
            "text <s> in the middle",
            "<unk> and </s> tokens",
            "<s> <s>",
        ],
    ),
    ("gpt2", &[]),
    ("llama3", &[]),
    // Combining accents, which HF's NFC normalizer composes and llama.cpp does not.
    (
        "qwen2",
        &[
            "cafe\u{301} nai\u{308}ve re\u{301}sume\u{301}",
            "Ångström vs A\u{30a}ngstro\u{308}m",
        ],
    ),
    ("gemma", &[]),
    // SentencePiece's leading space as for spm; and llama.cpp strips the
    // whitespace after Phi-3's special tokens (it tells Phi-3 by its
    // general.name), which the HF tokenizer here does not.
    (
        "phi3",
        &[
            " ",
            "  ",
            "   leading spaces",
            " \n \n\n \t\t \n",
            "<|user|>\nHello<|end|>\n<|assistant|>\n",
        ],
    ),
];

#[derive(Deserialize)]
struct LlamaCppCase {
    text: String,
    ids_no_special: Vec<u32>,
    ids_llamacpp: Option<LlamaCppIds>,
}

#[derive(Deserialize)]
struct LlamaCppIds {
    with_special: Vec<u32>,
    no_special: Vec<u32>,
}

#[test]
fn llama_cpp_ids_match_ours_wherever_llama_cpp_agrees_with_hugging_face() {
    for (kind, differs) in LLAMACPP_DIFFERS {
        let dir = fixture_dir();
        let text = std::fs::read_to_string(dir.join(format!("{kind}.json"))).unwrap();
        let cases: Vec<LlamaCppCase> = serde_json::from_value(
            serde_json::from_str::<serde_json::Value>(&text).unwrap()["cases"].clone(),
        )
        .unwrap();
        let gguf = Gguf::open(dir.join(format!("{kind}.gguf"))).unwrap();
        let tok = Tokenizer::from_metadata(gguf.metadata()).unwrap();
        let recorded: Vec<&str> = cases
            .iter()
            .filter(|c| c.ids_llamacpp.is_some())
            .map(|c| c.text.as_str())
            .collect();
        // The disagreements are exactly the documented ones.
        assert_eq!(
            recorded, *differs,
            "{kind}: llama.cpp's disagreements changed"
        );
        for case in &cases {
            let ours = tok.encode(&case.text, false);
            match &case.ids_llamacpp {
                // llama.cpp agreed with HF: ours must be both.
                None => assert_eq!(ours, case.ids_no_special, "{kind} {:?}", case.text),
                // We follow HF there, so llama.cpp's recorded ids must
                // really differ from ours (else the entry is stale).
                Some(lc) => {
                    assert_ne!(
                        ours, lc.no_special,
                        "{kind} {:?}: now matches llama.cpp",
                        case.text
                    );
                    assert_ne!(
                        tok.encode(&case.text, true),
                        lc.with_special,
                        "{kind} {:?}: now matches llama.cpp",
                        case.text
                    );
                }
            }
        }
    }
}
