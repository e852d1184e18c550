//! Reading a [`TokenizerConfig`] from GGUF metadata (`tokenizer.ggml.*`).

use super::{Tokenizer, TokenizerConfig, TokenizerError};
use crate::gguf::{GgufError, Metadata};

impl TokenizerConfig {
    /// Collects the `tokenizer.ggml.*` keys. Errors name the key that is
    /// missing or has the wrong type.
    pub fn from_metadata(md: &Metadata) -> Result<TokenizerConfig, TokenizerError> {
        const TOKENS: &str = "tokenizer.ggml.tokens";
        const TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
        let model = md.require_str("tokenizer.ggml.model")?.to_owned();
        let tokens = md
            .get_str_array(TOKENS)?
            .ok_or_else(|| GgufError::MissingKey(TOKENS.to_owned()))?
            .to_vec();
        let token_types = md
            .get_int_array(TOKEN_TYPE)?
            .map(|types| {
                types
                    .into_iter()
                    .enumerate()
                    .map(|(id, t)| {
                        i32::try_from(t).map_err(|_| TokenizerError::InvalidTokenType {
                            id,
                            value: i32::MAX,
                        })
                    })
                    .collect::<Result<Vec<i32>, _>>()
            })
            .transpose()?;
        Ok(TokenizerConfig {
            model,
            pre: md.get_str("tokenizer.ggml.pre")?.map(str::to_owned),
            tokens,
            scores: md
                .get_f32_array("tokenizer.ggml.scores")?
                .map(<[f32]>::to_vec),
            token_types,
            merges: md
                .get_str_array("tokenizer.ggml.merges")?
                .map(<[String]>::to_vec),
            bos_id: md.get_u32("tokenizer.ggml.bos_token_id")?,
            eos_id: md.get_u32("tokenizer.ggml.eos_token_id")?,
            eot_id: md.get_u32("tokenizer.ggml.eot_token_id")?,
            unk_id: md.get_u32("tokenizer.ggml.unknown_token_id")?,
            pad_id: md.get_u32("tokenizer.ggml.padding_token_id")?,
            add_bos: md.get_bool("tokenizer.ggml.add_bos_token")?,
            add_eos: md.get_bool("tokenizer.ggml.add_eos_token")?,
            add_space_prefix: md.get_bool("tokenizer.ggml.add_space_prefix")?,
        })
    }
}

impl Tokenizer {
    /// Builds the tokenizer a GGUF file describes.
    pub fn from_metadata(md: &Metadata) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::new(TokenizerConfig::from_metadata(md)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::writer::GgufWriter;
    use crate::gguf::{Array, GgufLayout, Limits, Value};

    fn metadata(entries: Vec<(&str, Value)>) -> Metadata {
        let mut w = GgufWriter::new();
        for (k, v) in entries {
            w.metadata(k, v);
        }
        GgufLayout::parse(&w.to_bytes(), &Limits::default())
            .unwrap()
            .metadata
    }

    fn strings(v: &[&str]) -> Value {
        Value::Array(Array::String(v.iter().map(|s| (*s).to_owned()).collect()))
    }

    #[test]
    fn reads_all_keys() {
        let md = metadata(vec![
            ("tokenizer.ggml.model", Value::String("gpt2".into())),
            ("tokenizer.ggml.pre", Value::String("qwen2".into())),
            (
                "tokenizer.ggml.tokens",
                strings(&["a", "b", "ab", "<|im_end|>"]),
            ),
            (
                "tokenizer.ggml.token_type",
                Value::Array(Array::I32(vec![1, 1, 1, 3])),
            ),
            ("tokenizer.ggml.merges", strings(&["a b"])),
            ("tokenizer.ggml.eos_token_id", Value::U32(3)),
            ("tokenizer.ggml.add_bos_token", Value::Bool(false)),
        ]);
        let cfg = TokenizerConfig::from_metadata(&md).unwrap();
        assert_eq!(cfg.pre.as_deref(), Some("qwen2"));
        assert_eq!(cfg.token_types, Some(vec![1, 1, 1, 3]));
        assert_eq!(cfg.eos_id, Some(3));
        assert_eq!(cfg.add_bos, Some(false));
        let tok = Tokenizer::new(cfg).unwrap();
        assert_eq!(tok.encode("ab<|im_end|>", true), [2, 3]);
    }

    #[test]
    fn errors_name_the_key() {
        let md = metadata(vec![(
            "tokenizer.ggml.model",
            Value::String("llama".into()),
        )]);
        let err = TokenizerConfig::from_metadata(&md).unwrap_err().to_string();
        assert!(err.contains("tokenizer.ggml.tokens"), "{err}");
        let md = metadata(vec![
            ("tokenizer.ggml.model", Value::String("llama".into())),
            ("tokenizer.ggml.tokens", strings(&["a"])),
            ("tokenizer.ggml.bos_token_id", Value::String("1".into())),
        ]);
        let err = TokenizerConfig::from_metadata(&md).unwrap_err().to_string();
        assert!(err.contains("tokenizer.ggml.bos_token_id"), "{err}");
        let md = metadata(vec![("tokenizer.ggml.tokens", strings(&["a"]))]);
        let err = TokenizerConfig::from_metadata(&md).unwrap_err().to_string();
        assert!(err.contains("tokenizer.ggml.model"), "{err}");
    }
}
