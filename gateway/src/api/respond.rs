//! OpenAI response bodies: whole completions and streamed chunks, for both
//! endpoints.

use serde_json::{Value, json};

use super::openai::Endpoint;

pub use crate::request::Finish;

/// Token counts of one request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
}

impl Usage {
    fn json(self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        })
    }
}

/// What every body of one response repeats.
#[derive(Clone, Debug)]
pub struct ResponseMeta {
    pub endpoint: Endpoint,
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    pub model: String,
}

impl ResponseMeta {
    pub fn new(endpoint: Endpoint, request_id: &str, model: &str) -> ResponseMeta {
        let prefix = match endpoint {
            Endpoint::Chat => "chatcmpl-",
            Endpoint::Completion => "cmpl-",
        };
        ResponseMeta {
            endpoint,
            id: format!("{prefix}{request_id}"),
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            model: model.to_string(),
        }
    }

    /// The whole (non-streamed) response.
    pub fn complete(&self, text: &str, finish: Finish, usage: Usage) -> Value {
        let choice = match self.endpoint {
            Endpoint::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": null,
                "finish_reason": finish.as_str(),
            }),
            Endpoint::Completion => json!({
                "index": 0,
                "text": text,
                "logprobs": null,
                "finish_reason": finish.as_str(),
            }),
        };
        json!({
            "id": self.id,
            "object": self.object(false),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage.json(),
        })
    }

    /// One streamed chunk carrying `text` (the first chat chunk also says the
    /// role) and, on the last one, the finish reason. With `include_usage`
    /// every chunk has `"usage": null`, as OpenAI sends them.
    pub fn chunk(
        &self,
        text: &str,
        first: bool,
        finish: Option<Finish>,
        include_usage: bool,
    ) -> Value {
        let finish = finish.map(Finish::as_str);
        let choice = match self.endpoint {
            Endpoint::Chat => {
                let delta = if first {
                    json!({"role": "assistant", "content": text})
                } else if finish.is_some() && text.is_empty() {
                    json!({})
                } else {
                    json!({"content": text})
                };
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
            }
            Endpoint::Completion => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish})
            }
        };
        let mut chunk = json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        });
        if include_usage {
            chunk["usage"] = Value::Null;
        }
        chunk
    }

    /// The extra last chunk of `stream_options.include_usage`: no choices, the usage.
    pub fn usage_chunk(&self, usage: Usage) -> Value {
        json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage.json(),
        })
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completion, _) => "text_completion",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_follow_openai() {
        let chat = ResponseMeta::new(Endpoint::Chat, "abc", "m");
        let usage = Usage {
            prompt_tokens: 3,
            completion_tokens: 2,
        };
        let full = chat.complete("hi", Finish::Length, usage);
        assert_eq!(full["id"], "chatcmpl-abc");
        assert_eq!(full["object"], "chat.completion");
        assert_eq!(full["choices"][0]["message"]["content"], "hi");
        assert_eq!(full["choices"][0]["finish_reason"], "length");
        assert_eq!(full["usage"]["total_tokens"], 5);

        let first = chat.chunk("", true, None, true);
        assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
        assert!(first["usage"].is_null() && first.get("usage").is_some());
        let last = chat.chunk("", false, Some(Finish::Stop), false);
        assert_eq!(last["choices"][0]["delta"], json!({}));
        assert!(last.get("usage").is_none());
        let u = chat.usage_chunk(usage);
        assert_eq!(u["choices"], json!([]));
        assert_eq!(u["usage"]["completion_tokens"], 2);

        let cmpl = ResponseMeta::new(Endpoint::Completion, "abc", "m");
        assert_eq!(
            cmpl.complete("x", Finish::Stop, usage)["choices"][0]["text"],
            "x"
        );
        assert_eq!(
            cmpl.chunk("y", true, None, false)["object"],
            "text_completion"
        );
        assert_eq!(
            cmpl.chunk("y", true, None, false)["choices"][0]["text"],
            "y"
        );
    }
}
