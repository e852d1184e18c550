//! OpenAI request bodies → one typed [`InferenceRequest`] (`crate::request`).
//!
//! Parsed field by field from a JSON object rather than through a derived
//! struct, so every error names the parameter (`param`) the way OpenAI does,
//! and a parameter we do not implement is refused by name instead of being
//! silently ignored.

use serde_json::{Map, Value};

use super::error::ApiError;
pub use crate::request::{
    COMPLETIONS_DEFAULT_MAX_TOKENS, Endpoint, InferenceRequest, MAX_MESSAGES, MAX_STOP,
    MAX_STOP_BYTES, PRIORITY_RANGE, Prompt,
};

impl InferenceRequest {
    /// Parses and validates a request body for `endpoint`.
    pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<InferenceRequest, ApiError> {
        let value: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::invalid_body(format!("the body is not valid JSON: {e}")))?;
        let Value::Object(mut fields) = value else {
            return Err(ApiError::invalid_body("the body must be a JSON object"));
        };
        // `null` means "not given" for every parameter, as in OpenAI's API.
        fields.retain(|_, v| !v.is_null());
        let mut p = Fields(fields);

        let model = p.string("model")?.ok_or_else(|| missing("model"))?;
        let prompt = match endpoint {
            Endpoint::Chat => Prompt::Chat(p.messages()?),
            Endpoint::Completion => p.prompt()?,
        };
        let max_tokens = match endpoint {
            // The newer name wins when both are given, as in OpenAI's API.
            Endpoint::Chat => match p.u32("max_completion_tokens")? {
                Some(n) => {
                    p.take("max_tokens");
                    Some(n)
                }
                None => p.u32("max_tokens")?,
            },
            Endpoint::Completion => p.u32("max_tokens")?,
        };
        if max_tokens == Some(0) {
            return Err(ApiError::invalid_param(
                "max_tokens",
                "max_tokens must be at least 1",
            ));
        }
        let temperature = p.f32_in("temperature", 0.0..=2.0)?.unwrap_or(1.0);
        let top_p = p.f32_in("top_p", 0.0..=1.0)?.unwrap_or(1.0);
        if top_p == 0.0 {
            return Err(ApiError::invalid_param("top_p", "top_p must be above 0"));
        }
        let request = InferenceRequest {
            endpoint,
            model,
            prompt,
            max_tokens,
            temperature,
            top_p,
            top_k: p.u32("top_k")?,
            min_p: p.f32_in("min_p", 0.0..=1.0)?,
            repetition_penalty: p.f32_in("repetition_penalty", 0.01..=10.0)?,
            seed: p.seed()?,
            stop: p.stop()?,
            stream: p.bool("stream")?.unwrap_or(false),
            include_usage: p.include_usage()?,
            priority: p.priority()?,
        };
        p.unsupported(endpoint)?;
        Ok(request)
    }
}

fn missing(param: &str) -> ApiError {
    ApiError::invalid_param(param, format!("`{param}` is required"))
}

/// The fields of a request object not yet consumed.
struct Fields(Map<String, Value>);

impl Fields {
    fn take(&mut self, name: &str) -> Option<Value> {
        self.0.remove(name)
    }

    fn string(&mut self, name: &str) -> Result<Option<String>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(ApiError::invalid_param(
                name,
                format!("`{name}` must be a string"),
            )),
        }
    }

    fn bool(&mut self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(b)),
            Some(_) => Err(ApiError::invalid_param(
                name,
                format!("`{name}` must be true or false"),
            )),
        }
    }

    fn u32(&mut self, name: &str) -> Result<Option<u32>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| {
                    ApiError::invalid_param(name, format!("`{name}` must be a whole number ≥ 0"))
                }),
        }
    }

    fn f32_in(
        &mut self,
        name: &str,
        range: std::ops::RangeInclusive<f32>,
    ) -> Result<Option<f32>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if range.contains(&(x as f32)) => Ok(Some(x as f32)),
                _ => Err(ApiError::invalid_param(
                    name,
                    format!(
                        "`{name}` must be a number from {} to {}",
                        range.start(),
                        range.end()
                    ),
                )),
            },
        }
    }

    fn seed(&mut self) -> Result<Option<u64>, ApiError> {
        match self.take("seed") {
            None => Ok(None),
            // Negative seeds are valid in OpenAI's API; reinterpret the bits.
            Some(v) => v
                .as_u64()
                .or_else(|| v.as_i64().map(|n| n as u64))
                .map(Some)
                .ok_or_else(|| ApiError::invalid_param("seed", "`seed` must be an integer")),
        }
    }

    fn priority(&mut self) -> Result<Option<i32>, ApiError> {
        match self.take("priority") {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .filter(|n| PRIORITY_RANGE.contains(n))
                .and_then(|n| i32::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| {
                    ApiError::invalid_param(
                        "priority",
                        format!(
                            "`priority` must be an integer from {} to {} (higher runs first among your requests)",
                            PRIORITY_RANGE.start(),
                            PRIORITY_RANGE.end()
                        ),
                    )
                }),
        }
    }

    fn stop(&mut self) -> Result<Vec<String>, ApiError> {
        let stops = match self.take("stop") {
            None => return Ok(Vec::new()),
            Some(Value::String(s)) => vec![s],
            Some(Value::Array(items)) => items
                .into_iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s),
                    _ => Err(ApiError::invalid_param(
                        "stop",
                        "`stop` must be a string or an array of strings",
                    )),
                })
                .collect::<Result<_, _>>()?,
            Some(_) => {
                return Err(ApiError::invalid_param(
                    "stop",
                    "`stop` must be a string or an array of strings",
                ));
            }
        };
        if stops.len() > MAX_STOP {
            return Err(ApiError::invalid_param(
                "stop",
                format!("at most {MAX_STOP} stop sequences are allowed"),
            ));
        }
        if stops
            .iter()
            .any(|s| s.is_empty() || s.len() > MAX_STOP_BYTES)
        {
            return Err(ApiError::invalid_param(
                "stop",
                format!("each stop sequence must be 1 to {MAX_STOP_BYTES} bytes"),
            ));
        }
        Ok(stops)
    }

    fn include_usage(&mut self) -> Result<bool, ApiError> {
        match self.take("stream_options") {
            None => Ok(false),
            Some(Value::Object(mut options)) => {
                let include = match options.remove("include_usage") {
                    None | Some(Value::Null) => false,
                    Some(Value::Bool(b)) => b,
                    Some(_) => {
                        return Err(ApiError::invalid_param(
                            "stream_options.include_usage",
                            "`stream_options.include_usage` must be true or false",
                        ));
                    }
                };
                if let Some(name) = options.keys().next() {
                    return Err(ApiError::unsupported_param(
                        format!("stream_options.{name}"),
                        format!("`stream_options.{name}` is not supported"),
                    ));
                }
                Ok(include)
            }
            Some(_) => Err(ApiError::invalid_param(
                "stream_options",
                "`stream_options` must be an object",
            )),
        }
    }

    fn messages(&mut self) -> Result<Vec<(String, String)>, ApiError> {
        let Some(Value::Array(items)) = self.take("messages") else {
            return Err(ApiError::invalid_param(
                "messages",
                "`messages` is required and must be an array",
            ));
        };
        if items.is_empty() || items.len() > MAX_MESSAGES {
            return Err(ApiError::invalid_param(
                "messages",
                format!("`messages` must hold 1 to {MAX_MESSAGES} messages"),
            ));
        }
        items
            .into_iter()
            .enumerate()
            .map(|(i, item)| message(i, item))
            .collect()
    }

    fn prompt(&mut self) -> Result<Prompt, ApiError> {
        let bad = || {
            ApiError::invalid_param(
                "prompt",
                "`prompt` must be a string, an array of one string, or an array of token ids",
            )
        };
        match self.take("prompt") {
            None => Err(missing("prompt")),
            Some(Value::String(s)) => Ok(Prompt::Text(s)),
            Some(Value::Array(items)) => match items.as_slice() {
                [Value::String(s)] => Ok(Prompt::Text(s.clone())),
                [] => Err(bad()),
                [Value::Number(_), ..] => items
                    .iter()
                    .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
                    .collect::<Option<Vec<u32>>>()
                    .map(Prompt::Tokens)
                    .ok_or_else(bad),
                [Value::String(_), ..] => Err(ApiError::unsupported_param(
                    "prompt",
                    "batches of prompts are not supported; send one prompt per request",
                )),
                _ => Err(bad()),
            },
            Some(_) => Err(bad()),
        }
    }

    /// Refuses what is left, except parameters whose value asks for exactly
    /// what we do anyway (`n: 1`, `presence_penalty: 0`, …) or that only
    /// label the request (`user`).
    fn unsupported(self, endpoint: Endpoint) -> Result<(), ApiError> {
        for (name, value) in self.0 {
            let harmless = match name.as_str() {
                "user" | "metadata" => true,
                "n" | "best_of" => value.as_u64() == Some(1),
                "presence_penalty" | "frequency_penalty" => value.as_f64() == Some(0.0),
                "logprobs" | "echo" | "store" | "parallel_tool_calls" => {
                    value == Value::Bool(false)
                }
                "logit_bias" => value.as_object().is_some_and(Map::is_empty),
                "tools" | "functions" => value.as_array().is_some_and(Vec::is_empty),
                "tool_choice" | "function_call" => value == "none",
                "response_format" => value.get("type").is_some_and(|t| t == "text"),
                _ => false,
            };
            if harmless {
                continue;
            }
            let message = match name.as_str() {
                "n" | "best_of" => format!("`{name}` must be 1: one choice per request"),
                "prompt" if endpoint == Endpoint::Chat => {
                    "`prompt` belongs to /v1/completions; chat completions take `messages`".into()
                }
                "messages" if endpoint == Endpoint::Completion => {
                    "`messages` belongs to /v1/chat/completions; completions take `prompt`".into()
                }
                _ => format!("`{name}` is not supported by this gateway"),
            };
            return Err(ApiError::unsupported_param(name, message));
        }
        Ok(())
    }
}

/// One chat message: `role` and `content` (a string, or text parts).
fn message(index: usize, item: Value) -> Result<(String, String), ApiError> {
    let param = |field: &str| format!("messages[{index}].{field}");
    let Value::Object(mut m) = item else {
        return Err(ApiError::invalid_param(
            format!("messages[{index}]"),
            format!("messages[{index}] must be an object"),
        ));
    };
    let role = match m.remove("role") {
        Some(Value::String(role)) => match role.as_str() {
            "system" | "user" | "assistant" => role,
            // OpenAI's newer name for system instructions.
            "developer" => "system".to_string(),
            other => {
                return Err(ApiError::unsupported_param(
                    param("role"),
                    format!(
                        "{}: role `{other}` is not supported; use system, user or assistant",
                        param("role")
                    ),
                ));
            }
        },
        _ => {
            return Err(ApiError::invalid_param(
                param("role"),
                format!("{} is required and must be a string", param("role")),
            ));
        }
    };
    let content = match m.remove("content") {
        Some(Value::String(s)) => s,
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                match (part.get("type"), part.get("text")) {
                    (Some(t), Some(Value::String(s))) if t == "text" => text.push_str(s),
                    _ => {
                        return Err(ApiError::unsupported_param(
                            format!("messages[{index}].content[{j}]"),
                            format!(
                                "messages[{index}].content[{j}]: only text content parts are supported"
                            ),
                        ));
                    }
                }
            }
            text
        }
        None | Some(Value::Null) if role == "assistant" => String::new(),
        _ => {
            return Err(ApiError::invalid_param(
                param("content"),
                format!(
                    "{} must be a string or an array of text parts",
                    param("content")
                ),
            ));
        }
    };
    m.remove("name");
    if let Some(name) = m.keys().next() {
        return Err(ApiError::unsupported_param(
            param(name),
            format!("{} is not supported", param(name)),
        ));
    }
    Ok((role, content))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: &str) -> Result<InferenceRequest, ApiError> {
        InferenceRequest::parse(Endpoint::Chat, body.as_bytes())
    }

    fn completion(body: &str) -> Result<InferenceRequest, ApiError> {
        InferenceRequest::parse(Endpoint::Completion, body.as_bytes())
    }

    #[test]
    fn a_full_chat_request_parses_with_openai_defaults() {
        let r = chat(
            r#"{"model":"m","messages":[{"role":"developer","content":"be brief"},
                {"role":"user","content":[{"type":"text","text":"hi"},{"type":"text","text":"!"}]}],
                "stream":true,"stream_options":{"include_usage":true},"stop":"\n",
                "seed":-1,"max_completion_tokens":7,"max_tokens":99,"n":1,"user":"u1","top_p":null}"#,
        )
        .unwrap();
        assert_eq!(r.model, "m");
        assert_eq!(
            r.prompt,
            Prompt::Chat(vec![
                ("system".into(), "be brief".into()),
                ("user".into(), "hi!".into())
            ])
        );
        assert_eq!(r.max_tokens, Some(7));
        assert_eq!((r.temperature, r.top_p), (1.0, 1.0));
        assert_eq!(r.seed, Some(u64::MAX));
        assert_eq!(r.stop, vec!["\n".to_string()]);
        assert!(r.stream && r.include_usage);
    }

    #[test]
    fn priority_is_a_bounded_integer() {
        let body = |p: &str| format!(r#"{{"model":"m","prompt":"a","priority":{p}}}"#);
        assert_eq!(completion(&body("7")).unwrap().priority, Some(7));
        assert_eq!(completion(&body("-100")).unwrap().priority, Some(-100));
        assert_eq!(
            completion(r#"{"model":"m","prompt":"a"}"#)
                .unwrap()
                .priority,
            None
        );
        for bad in ["101", "-101", "1.5", "\"high\"", "9223372036854775807"] {
            let e = completion(&body(bad)).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("priority"), "{bad}");
            assert!(e.message.contains("from -100 to 100"), "{}", e.message);
        }
    }

    #[test]
    fn completion_prompts_take_text_one_string_or_token_ids() {
        assert_eq!(
            completion(r#"{"model":"m","prompt":"a"}"#).unwrap().prompt,
            Prompt::Text("a".into())
        );
        assert_eq!(
            completion(r#"{"model":"m","prompt":["a"]}"#)
                .unwrap()
                .prompt,
            Prompt::Text("a".into())
        );
        assert_eq!(
            completion(r#"{"model":"m","prompt":[1,2,3]}"#)
                .unwrap()
                .prompt,
            Prompt::Tokens(vec![1, 2, 3])
        );
        let e = completion(r#"{"model":"m","prompt":["a","b"]}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("prompt"));
        assert!(e.message.contains("batches"), "{}", e.message);
    }

    #[test]
    fn errors_name_the_parameter() {
        for (body, param, code) in [
            (
                r#"{"messages":[{"role":"user","content":"x"}]}"#,
                "model",
                "invalid_parameter",
            ),
            (r#"{"model":"m"}"#, "messages", "invalid_parameter"),
            (
                r#"{"model":"m","messages":[]}"#,
                "messages",
                "invalid_parameter",
            ),
            (
                r#"{"model":"m","messages":[{"role":"tool","content":"x"}]}"#,
                "messages[0].role",
                "unsupported_parameter",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user"}]}"#,
                "messages[0].content",
                "invalid_parameter",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#,
                "messages[0].content[0]",
                "unsupported_parameter",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"n":2}"#,
                "n",
                "unsupported_parameter",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"temperature":3}"#,
                "temperature",
                "invalid_parameter",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"top_p":0}"#,
                "top_p",
                "invalid_parameter",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":0}"#,
                "max_tokens",
                "invalid_parameter",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":-5}"#,
                "max_tokens",
                "invalid_parameter",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"stop":["a","b","c","d","e"]}"#,
                "stop",
                "invalid_parameter",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"stop":[""]}"#,
                "stop",
                "invalid_parameter",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true}"#,
                "logprobs",
                "unsupported_parameter",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]}"#,
                "tools",
                "unsupported_parameter",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"frobnicate":1}"#,
                "frobnicate",
                "unsupported_parameter",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"stream_options":{"x":1}}"#,
                "stream_options.x",
                "unsupported_parameter",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"stream":"yes"}"#,
                "stream",
                "invalid_parameter",
            ),
        ] {
            let e = chat(body).unwrap_err();
            assert_eq!(e.status, 400, "{body}");
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
            assert_eq!(e.code, code, "{body}");
            assert!(
                e.message.contains(param.split('[').next().unwrap()),
                "{body}: {}",
                e.message
            );
        }
    }

    #[test]
    fn malformed_bodies_are_400_with_the_reason() {
        for body in ["", "{", "[]", "\"x\"", "{\"model\":}", "\u{0}"] {
            let e = chat(body).unwrap_err();
            assert_eq!(e.status, 400, "{body:?}");
            assert_eq!(e.code, "invalid_json", "{body:?}");
        }
    }

    #[test]
    fn the_prompt_bound_is_never_below_a_byte_per_token() {
        let r = chat(r#"{"model":"m","messages":[{"role":"user","content":"héllo"}]}"#).unwrap();
        assert!(r.prompt_token_bound() >= "user".len() as u64 + "héllo".len() as u64);
        let r = completion(r#"{"model":"m","prompt":[5,6,7]}"#).unwrap();
        assert_eq!(r.prompt_token_bound(), 3);
    }
}
