//! Tokenizer tests on small hand-built vocabularies.

use proptest::prelude::*;

use super::*;

const CONTROL: i32 = 3;
const NORMAL: i32 = 1;
const BYTE: i32 = 6;

/// A SentencePiece vocabulary: `<unk> <s> </s>`, 256 byte tokens, then pieces.
pub(super) fn spm_config() -> TokenizerConfig {
    let mut tokens = vec!["<unk>".to_owned(), "<s>".to_owned(), "</s>".to_owned()];
    let mut types = vec![2, CONTROL, CONTROL];
    let mut scores = vec![0.0, 0.0, 0.0];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(BYTE);
        scores.push(0.0);
    }
    let pieces: &[(&str, f32)] = &[
        ("▁", -1.0),
        ("h", -5.0),
        ("e", -5.0),
        ("l", -5.0),
        ("o", -5.0),
        ("w", -5.0),
        ("r", -5.0),
        ("d", -5.0),
        ("he", -3.0),
        ("ll", -2.0),
        ("llo", -2.5),
        ("hello", -2.0),
        ("▁hello", -1.0),
        ("or", -3.0),
        ("ld", -3.0),
        ("▁w", -3.0),
        ("▁wor", -2.5),
        ("▁world", -1.5),
        ("é", -6.0),
        ("<|user|>", 0.0),
    ];
    for &(p, s) in pieces {
        tokens.push(p.to_owned());
        types.push(NORMAL);
        scores.push(s);
    }
    *types.last_mut().unwrap() = 4; // <|user|> is user-defined
    TokenizerConfig {
        model: "llama".to_owned(),
        tokens,
        scores: Some(scores),
        token_types: Some(types),
        bos_id: Some(1),
        eos_id: Some(2),
        unk_id: Some(0),
        ..TokenizerConfig::default()
    }
}

/// A byte-level BPE vocabulary: the 256 byte characters, a few merges, and
/// `<|endoftext|>` / `<|im_start|>` / `<|im_end|>` control tokens.
pub(super) fn bpe_config(pre: &str) -> TokenizerConfig {
    let table = bpe::byte_to_char_table();
    let mut tokens: Vec<String> = table.iter().map(|c| c.to_string()).collect();
    let mut types = vec![NORMAL; 256];
    let merges = [
        "Ġ t", "h e", "Ġt he", "i n", "Ġ in", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or",
        "l d", "Ġwor ld", "1 2", "12 3", "Ċ Ċ", "' s", "Ġ Ġ",
    ];
    for m in merges {
        tokens.push(m.replace(' ', ""));
        types.push(NORMAL);
    }
    // Reachable only whole (no merge path): exercises Llama 3's ignore_merges.
    tokens.push("Ġxyz".to_owned());
    types.push(NORMAL);
    for special in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] {
        tokens.push(special.to_owned());
        types.push(CONTROL);
    }
    let eot = tokens.len() as u32 - 3;
    TokenizerConfig {
        model: "gpt2".to_owned(),
        pre: Some(pre.to_owned()),
        tokens,
        token_types: Some(types),
        merges: Some(merges.iter().map(|m| (*m).to_owned()).collect()),
        bos_id: Some(eot),
        eos_id: Some(eot),
        ..TokenizerConfig::default()
    }
}

fn texts(tok: &Tokenizer, ids: &[u32]) -> Vec<String> {
    ids.iter()
        .map(|&id| tok.token_text(id).unwrap().to_owned())
        .collect()
}

#[test]
fn spm_merges_by_score_with_space_prefix() {
    let tok = Tokenizer::new(spm_config()).unwrap();
    let ids = tok.encode("hello world", true);
    assert_eq!(ids[0], 1);
    assert_eq!(texts(&tok, &ids[1..]), ["▁hello", "▁world"]);
    assert_eq!(tok.decode(&ids), "<s> hello world");
    assert_eq!(tok.decode(&ids[1..]), "hello world");
    let no_prefix = Tokenizer::new(TokenizerConfig {
        add_space_prefix: Some(false),
        ..spm_config()
    })
    .unwrap();
    assert_eq!(
        texts(&no_prefix, &no_prefix.encode("hello", false)),
        ["hello"]
    );
}

#[test]
fn spm_no_extra_prefix_when_text_starts_with_space() {
    // HF Metaspace (prepend_scheme "always"): no second `▁`; llama.cpp adds one.
    let tok = Tokenizer::new(spm_config()).unwrap();
    assert_eq!(texts(&tok, &tok.encode(" hello", false)), ["▁hello"]);
    assert_eq!(
        texts(&tok, &tok.encode("<s> hello", false)),
        ["<s>", "▁hello"]
    );
    assert_eq!(
        texts(&tok, &tok.encode("<s>hello", false)),
        ["<s>", "▁hello"]
    );
}

#[test]
fn spm_byte_fallback_and_spaces() {
    let tok = Tokenizer::new(spm_config()).unwrap();
    let ids = tok.encode("h€  é", false);
    assert_eq!(
        texts(&tok, &ids),
        ["▁", "h", "<0xE2>", "<0x82>", "<0xAC>", "▁", "▁", "é"]
    );
    assert_eq!(tok.decode(&ids), "h€  é");
    assert_eq!(tok.token_bytes(ids[2]), Some(&[0xE2][..]));
}

#[test]
fn spm_special_tokens_split_first() {
    let tok = Tokenizer::new(spm_config()).unwrap();
    let ids = tok.encode("<s>hello<|user|>world</s>", false);
    assert_eq!(
        texts(&tok, &ids),
        ["<s>", "▁hello", "<|user|>", "▁world", "</s>"]
    );
    // Like llama.cpp, text after a special token gets its own space prefix.
    assert_eq!(tok.decode(&ids), "<s> hello<|user|> world</s>");
}

#[test]
fn bpe_gpt2_merges_and_specials() {
    let tok = Tokenizer::new(bpe_config("gpt-2")).unwrap();
    let ids = tok.encode("hello world<|endoftext|> the", true);
    assert_eq!(
        texts(&tok, &ids),
        ["hello", "Ġworld", "<|endoftext|>", "Ġthe"]
    );
    assert_eq!(tok.decode(&ids), "hello world<|endoftext|> the");
    assert!(!tok.adds_bos());
    // Digits: GPT-2 keeps the whole run; merges make 123 then 4.
    assert_eq!(texts(&tok, &tok.encode("1234", false)), ["123", "4"]);
    // `\s+(?!\S)`: two spaces before a word split as " " + " the".
    assert_eq!(
        texts(&tok, &tok.encode("a  the", false)),
        ["a", "Ġ", "Ġthe"]
    );
    assert_eq!(texts(&tok, &tok.encode("it's", false)), ["i", "t", "'s"]);
    // Without ignore_merges "Ġxyz" is not reachable.
    assert_eq!(
        texts(&tok, &tok.encode(" xyz", false)),
        ["Ġ", "x", "y", "z"]
    );
}

#[test]
fn bpe_llama3_and_qwen2() {
    let llama3 = Tokenizer::new(bpe_config("llama-bpe")).unwrap();
    assert!(llama3.adds_bos());
    let ids = llama3.encode("1234 xyz\n\n", true);
    assert_eq!(
        texts(&llama3, &ids),
        ["<|endoftext|>", "123", "4", "Ġxyz", "ĊĊ"]
    );
    let qwen2 = Tokenizer::new(bpe_config("qwen2")).unwrap();
    assert!(!qwen2.adds_bos());
    assert_eq!(
        texts(&qwen2, &qwen2.encode("123 xyz", true)),
        ["1", "2", "3", "Ġ", "x", "y", "z"]
    );
    let text = "<|im_start|>user\nhi<|im_end|>\n";
    let ids = qwen2.encode(text, false);
    assert_eq!(texts(&qwen2, &ids)[0], "<|im_start|>");
    assert_eq!(qwen2.decode(&ids), text);
    let im_end = qwen2.token_id("<|im_end|>").unwrap();
    assert!(qwen2.is_end_of_generation(im_end));
    assert!(!qwen2.is_end_of_generation(qwen2.token_id("<|im_start|>").unwrap()));
}

#[test]
fn bpe_roundtrips_arbitrary_unicode() {
    let tok = Tokenizer::new(bpe_config("llama-bpe")).unwrap();
    let text = "Ünïcödé 中文 😀\t\r\n  ١٢٣ it'S";
    assert_eq!(tok.decode(&tok.encode(text, false)), text);
}

#[test]
fn config_errors_name_the_problem() {
    let err = |cfg| Tokenizer::new(cfg).unwrap_err().to_string();
    assert!(
        err(TokenizerConfig {
            model: "wordpiece".into(),
            ..spm_config()
        })
        .contains("wordpiece")
    );
    assert!(
        err(TokenizerConfig {
            pre: Some("nope".into()),
            ..bpe_config("x")
        })
        .contains("nope")
    );
    assert!(
        err(TokenizerConfig {
            bos_id: Some(1 << 30),
            ..spm_config()
        })
        .contains("bos_token_id")
    );
    assert!(
        err(TokenizerConfig {
            scores: Some(vec![0.0]),
            ..spm_config()
        })
        .contains("scores")
    );
    assert!(
        err(TokenizerConfig {
            merges: None,
            ..bpe_config("gpt-2")
        })
        .contains("merges")
    );
    assert!(
        err(TokenizerConfig {
            merges: Some(vec!["ab".into()]),
            ..bpe_config("gpt-2")
        })
        .contains("merge 0")
    );
    let mut long = spm_config();
    long.tokens[5] = "x".repeat(MAX_TOKEN_BYTES + 1);
    assert!(err(long).contains("limit"));
    let mut bad_type = spm_config();
    bad_type.token_types.as_mut().unwrap()[4] = 9;
    assert!(err(bad_type).contains("token type 9"));
    assert!(
        err(TokenizerConfig {
            tokens: vec![],
            ..spm_config()
        })
        .contains("empty")
    );
}

#[test]
fn stream_holds_back_partial_utf8() {
    let tok = Tokenizer::new(spm_config()).unwrap();
    let euro: Vec<u32> = ["<0xE2>", "<0x82>", "<0xAC>"]
        .iter()
        .map(|t| tok.token_id(t).unwrap())
        .collect();
    let hello = tok.token_id("▁hello").unwrap();
    let mut stream = tok.stream_decoder();
    assert_eq!(stream.push(hello), "hello");
    assert_eq!(stream.push(euro[0]), "");
    assert_eq!(stream.push(euro[1]), "");
    assert_eq!(stream.push(euro[2]), "€");
    assert_eq!(stream.push(euro[0]), "");
    assert_eq!(stream.finish(), "\u{FFFD}");
}

#[test]
fn long_inputs_stay_fast() {
    let spm = Tokenizer::new(spm_config()).unwrap();
    let bpe = Tokenizer::new(bpe_config("llama-bpe")).unwrap();
    let word = "l".repeat(1 << 20);
    let started = std::time::Instant::now();
    assert_eq!(spm.encode(&word, false).len(), 1 + (1 << 19));
    assert_eq!(bpe.encode(&word, false).len(), 1 << 19);
    let prose = "hello world, it's 1234 times\n".repeat(1 << 15);
    assert!(!spm.encode(&prose, false).is_empty());
    assert!(!bpe.encode(&prose, false).is_empty());
    assert!(
        started.elapsed().as_secs() < 10,
        "took {:?}",
        started.elapsed()
    );
}

fn any_ids(vocab: usize) -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(0..vocab as u32 + 2, 0..40)
}

proptest! {
    #[test]
    fn stream_equals_decode_spm(ids in any_ids(spm_config().tokens.len())) {
        let tok = Tokenizer::new(spm_config()).unwrap();
        check_stream(&tok, &ids)?;
    }

    #[test]
    fn stream_equals_decode_bpe(ids in any_ids(bpe_config("gpt-2").tokens.len())) {
        let tok = Tokenizer::new(bpe_config("gpt-2")).unwrap();
        check_stream(&tok, &ids)?;
    }

    #[test]
    fn encode_decode_roundtrip(text in "[a-zA-Z0-9 é€😀'\n\t.,!]{0,24}") {
        let bpe = Tokenizer::new(bpe_config("qwen2")).unwrap();
        prop_assert_eq!(bpe.decode(&bpe.encode(&text, false)), text.clone());
        let spm = Tokenizer::new(spm_config()).unwrap();
        // As in HF, a text that already starts with a space gets no extra
        // `▁`, and decode drops one leading space: " x" comes back as "x".
        let expected = text.strip_prefix(' ').unwrap_or(&text);
        prop_assert_eq!(spm.decode(&spm.encode(&text, false)), expected);
    }
}

fn check_stream(tok: &Tokenizer, ids: &[u32]) -> Result<(), TestCaseError> {
    let whole = tok.decode(ids);
    let mut stream = tok.stream_decoder();
    let mut joined = String::new();
    for &id in ids {
        let piece = stream.push(id);
        // A replacement character may only appear where decode has one too.
        let bad = char::REPLACEMENT_CHARACTER;
        prop_assert!(!piece.contains(bad) || whole.contains(bad));
        joined.push_str(&piece);
    }
    joined.push_str(&stream.finish());
    prop_assert_eq!(joined, whole);
    Ok(())
}
