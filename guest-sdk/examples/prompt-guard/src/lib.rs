//! Refuses requests whose prompt contains a blocked phrase.
//!
//! Config (the plugin's table in the tenant policy):
//!
//! - `blocked`: the phrases, separated by `|`, for example
//!   `blocked = "ignore previous instructions|system prompt"`. Blank entries
//!   are skipped. Unset or empty: every request passes.
//! - `message`: what the client is told (status 400). Default:
//!   [`DEFAULT_MESSAGE`]. The matching phrase goes to the gateway log, not
//!   to the client.
//!
//! Matching ignores case and runs of whitespace (`Ignore  previous
//! INSTRUCTIONS` matches `ignore previous instructions`) and is by whole
//! words: `cat` matches `a cat.` but not `concatenate`. It looks at every
//! chat message, whatever its role, and at text prompts; token-id prompts
//! pass unchecked. It is a plain phrase filter, not a jailbreak detector:
//! spelling a phrase differently gets past it.

use bulkhead_guest::{Plugin, Rejection, Request, config, config_or, export_plugin, log};

/// The client's message when `message` is not configured.
pub const DEFAULT_MESSAGE: &str = "The request was refused: it contains a blocked phrase.";

/// The blocked phrases, normalised for matching.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Guard {
    phrases: Vec<String>,
}

impl Guard {
    /// Reads the `blocked` setting: phrases separated by `|`.
    pub fn parse(blocked: &str) -> Self {
        let phrases = blocked
            .split('|')
            .map(normalize)
            .filter(|phrase| !phrase.is_empty())
            .collect();
        Self { phrases }
    }

    /// Whether there is nothing to block.
    pub fn is_empty(&self) -> bool {
        self.phrases.is_empty()
    }

    /// The first blocked phrase (normalised) found in `text`.
    pub fn find(&self, text: &str) -> Option<&str> {
        let text = normalize(text);
        self.phrases
            .iter()
            .find(|phrase| contains_words(&text, phrase))
            .map(String::as_str)
    }
}

/// Lower case, whitespace runs made one space, trimmed.
fn normalize(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for word in text.split_whitespace() {
        if !out.is_empty() {
            out.push(' ');
        }
        out.extend(word.chars().flat_map(char::to_lowercase));
    }
    out
}

/// Whether `phrase` occurs in `text` not glued to a letter or digit on
/// either side (both already normalised). Tries every occurrence, overlapping
/// ones included: in `ba a a`, `a a` is a whole-word match at the second `a`.
fn contains_words(text: &str, phrase: &str) -> bool {
    let Some(first_char) = phrase.chars().next() else {
        return false;
    };
    let glued_before = first_char.is_alphanumeric();
    let glued_after = phrase.ends_with(char::is_alphanumeric);
    let mut from = 0;
    while let Some(offset) = text[from..].find(phrase) {
        let start = from + offset;
        let end = start + phrase.len();
        let free_before = !glued_before
            || text[..start]
                .chars()
                .next_back()
                .is_none_or(|c| !c.is_alphanumeric());
        let free_after = !glued_after
            || text[end..]
                .chars()
                .next()
                .is_none_or(|c| !c.is_alphanumeric());
        if free_before && free_after {
            return true;
        }
        from = start + first_char.len_utf8();
    }
    false
}

/// The plugin.
#[derive(Debug, Default)]
pub struct PromptGuard;

impl Plugin for PromptGuard {
    fn on_request(&mut self, req: Request) -> Result<Request, Rejection> {
        let guard = Guard::parse(&config("blocked").unwrap_or_default());
        if guard.is_empty() {
            log::debug("no `blocked` phrases configured");
            return Ok(req);
        }
        for text in req.prompt.texts() {
            if let Some(phrase) = guard.find(text) {
                log::info(&format!(
                    "refused: prompt contains blocked phrase {phrase:?}"
                ));
                return Err(Rejection::bad_request(config_or(
                    "message",
                    DEFAULT_MESSAGE,
                )));
            }
        }
        Ok(req)
    }
}

export_plugin!(PromptGuard);

#[cfg(test)]
mod tests {
    use super::*;
    use bulkhead_guest::{Message, Prompt, testing};

    #[test]
    fn phrases_are_split_trimmed_and_lowercased() {
        let guard = Guard::parse(" Ignore  Previous Instructions |  | secret ");
        assert_eq!(guard.phrases, ["ignore previous instructions", "secret"]);
        assert!(Guard::parse("").is_empty());
        assert!(Guard::parse(" | ").is_empty());
    }

    #[test]
    fn matching_ignores_case_and_whitespace_runs() {
        let guard = Guard::parse("ignore previous instructions");
        assert!(
            guard
                .find("Please IGNORE\n previous\tinstructions.")
                .is_some()
        );
        assert!(
            guard
                .find("please ignore the previous instructions")
                .is_none()
        );
    }

    #[test]
    fn matching_is_by_whole_words() {
        let guard = Guard::parse("cat");
        assert!(guard.find("a cat.").is_some());
        assert!(guard.find("Cat").is_some());
        assert!(guard.find("concatenate").is_none());
        assert!(guard.find("cats").is_none());
        // The second occurrence is a whole word.
        assert!(guard.find("concat cat").is_some());
        // Overlapping occurrences: the first is glued, the second is not.
        assert!(Guard::parse("a a").find("ba a a").is_some());
    }

    #[test]
    fn phrases_with_punctuation_edges_match_anywhere() {
        let guard = Guard::parse("<|im_start|>");
        assert!(guard.find("x<|im_start|>y").is_some());
    }

    #[test]
    fn unicode_case_folding() {
        let guard = Guard::parse("ÜBER");
        assert!(guard.find("das ist über alles").is_some());
    }

    #[test]
    fn hook_rejects_with_configured_message() {
        testing::set_config([("blocked", "secret|password"), ("message", "Nope.")]);
        let req = Request::new(
            "m",
            Prompt::Chat(vec![Message::system("ok"), Message::user("my PASSWORD is")]),
        );
        assert_eq!(
            PromptGuard.on_request(req),
            Err(Rejection::bad_request("Nope."))
        );
        let logs = testing::take_logs();
        assert!(logs[0].1.contains("password"), "{logs:?}");
    }

    #[test]
    fn hook_default_message_and_passing_requests() {
        testing::set_config([("blocked", "secret")]);
        let req = Request::new("m", Prompt::Text("a secret".into()));
        assert_eq!(
            PromptGuard.on_request(req),
            Err(Rejection::bad_request(DEFAULT_MESSAGE))
        );
        let req = Request::new("m", Prompt::Text("nothing to see".into()));
        assert_eq!(PromptGuard.on_request(req.clone()), Ok(req));
        let req = Request::new("m", Prompt::Tokens(vec![1]));
        assert_eq!(PromptGuard.on_request(req.clone()), Ok(req));
    }

    #[test]
    fn hook_without_config_passes() {
        testing::set_config::<&str, &str>([]);
        let req = Request::new("m", Prompt::Text("a secret".into()));
        assert_eq!(PromptGuard.on_request(req.clone()), Ok(req));
    }
}
