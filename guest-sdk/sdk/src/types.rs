//! The ABI's data types, with constructors and helpers.

pub use crate::bindings::bulkhead::plugin::types::{
    Message, Prompt, Rejection, Request, Response, Sampling,
};

impl Rejection {
    /// A rejection with any status. The gateway sends 400–499 as given and
    /// anything else as 400.
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    /// 400 Bad Request: the client's input is refused.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, message)
    }

    /// 403 Forbidden: the client may not do this.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, message)
    }

    /// 422 Unprocessable Content: well-formed, but fails a check (for
    /// example a response that had to be JSON and was not).
    pub fn unprocessable(message: impl Into<String>) -> Self {
        Self::new(422, message)
    }
}

impl Message {
    /// A message with any role.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }

    /// A `system` message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }

    /// A `user` message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    /// An `assistant` message.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

impl Prompt {
    /// The prompt's text pieces: every chat message's content, or the text
    /// prompt. Empty for a token-id prompt.
    pub fn texts(&self) -> Vec<&str> {
        match self {
            Prompt::Chat(messages) => messages.iter().map(|m| m.content.as_str()).collect(),
            Prompt::Text(text) => vec![text.as_str()],
            Prompt::Tokens(_) => Vec::new(),
        }
    }

    /// The same pieces as [`Prompt::texts`], to rewrite in place.
    pub fn texts_mut(&mut self) -> Vec<&mut String> {
        match self {
            Prompt::Chat(messages) => messages.iter_mut().map(|m| &mut m.content).collect(),
            Prompt::Text(text) => vec![text],
            Prompt::Tokens(_) => Vec::new(),
        }
    }
}

impl Request {
    /// A request with default sampling (`temperature` 1, `top_p` 1, nothing
    /// else set) and no metadata; handy in tests.
    pub fn new(model: impl Into<String>, prompt: Prompt) -> Self {
        Self {
            model: model.into(),
            prompt,
            sampling: Sampling::default(),
            metadata: Vec::new(),
        }
    }

    /// The value of the first metadata entry named `key`.
    pub fn metadata_value(&self, key: &str) -> Option<&str> {
        self.metadata
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Sets metadata `key` to `value`, replacing an entry with that key or
    /// adding one.
    pub fn set_metadata(&mut self, key: impl Into<String>, value: impl Into<String>) {
        let (key, value) = (key.into(), value.into());
        match self.metadata.iter_mut().find(|(k, _)| *k == key) {
            Some(entry) => entry.1 = value,
            None => self.metadata.push((key, value)),
        }
    }
}

impl Default for Sampling {
    /// OpenAI's defaults: `temperature` 1, `top_p` 1, nothing else set.
    fn default() -> Self {
        Self {
            max_tokens: None,
            temperature: 1.0,
            top_p: 1.0,
            seed: None,
            stop: Vec::new(),
        }
    }
}

impl Response {
    /// A finished (`stop`) response with zero token counts; handy in tests.
    pub fn new(model: impl Into<String>, text: impl Into<String>) -> Self {
        Self {
            model: model.into(),
            text: text.into(),
            finish_reason: "stop".into(),
            prompt_tokens: 0,
            completion_tokens: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejection_constructors() {
        assert_eq!(Rejection::bad_request("x"), Rejection::new(400, "x"));
        assert_eq!(Rejection::forbidden("x").status, 403);
        assert_eq!(Rejection::unprocessable("x").status, 422);
    }

    #[test]
    fn prompt_texts() {
        let mut chat = Prompt::Chat(vec![Message::system("s"), Message::user("u")]);
        assert_eq!(chat.texts(), ["s", "u"]);
        for text in chat.texts_mut() {
            text.push('!');
        }
        assert_eq!(chat.texts(), ["s!", "u!"]);
        assert_eq!(Prompt::Text("t".into()).texts(), ["t"]);
        assert!(Prompt::Tokens(vec![1, 2]).texts().is_empty());
        assert!(Prompt::Tokens(vec![1, 2]).texts_mut().is_empty());
    }

    #[test]
    fn metadata() {
        let mut req = Request::new("m", Prompt::Text("t".into()));
        assert_eq!(req.metadata_value("k"), None);
        req.set_metadata("k", "1");
        req.set_metadata("other", "x");
        req.set_metadata("k", "2");
        assert_eq!(req.metadata_value("k"), Some("2"));
        assert_eq!(req.metadata.len(), 2);
    }
}
