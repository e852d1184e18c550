//! Checks that the model's response is JSON and, if configured, an object
//! with the required keys.
//!
//! Config (the plugin's table in the tenant policy):
//!
//! - `required_keys`: comma-separated keys the response must be an object
//!   with, e.g. `required_keys = "name,age"`. Unset or empty: any valid JSON
//!   value passes.
//! - `mode`: `"reject"` (default) refuses a failing response with status 422
//!   and a message saying what is wrong (never quoting the response);
//!   `"annotate"` lets it through and writes the problem to the gateway log
//!   at warn level. (The ABI gives responses no metadata to annotate, so the
//!   log is where the note goes.) Any other value: logged as an error and
//!   treated as `"reject"`.
//!
//! Streams are buffered: `on_chunk` sends nothing and keeps the text; at
//! `on_stream_end` the whole text is checked and then sent at once, or
//! refused. A client therefore sees a JSON-guarded stream arrive in one
//! piece at the end. A stream longer than [`MAX_BUFFERED_BYTES`] is refused
//! in `"reject"` mode; in `"annotate"` mode it is logged and passed through
//! unchecked from then on.

use bulkhead_guest::{Plugin, Rejection, Response, config, export_plugin, log};

/// The most stream text held for checking. Buffering is the plugin's memory
/// cost per stream; 4 MiB is far above any sensible JSON answer and well
/// inside a plugin's memory limit.
pub const MAX_BUFFERED_BYTES: usize = 4 << 20;

/// What to do with a response that fails the check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Refuse it (422).
    Reject,
    /// Pass it and log the problem.
    Annotate,
}

/// What is wrong with a response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// Not valid JSON (the parser's message).
    NotJson(String),
    /// Valid JSON but not an object, and keys are required.
    NotAnObject,
    /// An object lacking these required keys.
    MissingKeys(Vec<String>),
    /// A stream too long to buffer and check.
    TooLong,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::NotJson(error) => write!(f, "the response is not valid JSON ({error})"),
            Problem::NotAnObject => f.write_str("the response is not a JSON object"),
            Problem::MissingKeys(keys) => {
                write!(f, "the response lacks required keys: {}", keys.join(", "))
            }
            Problem::TooLong => write!(
                f,
                "the response is too long to check (over {MAX_BUFFERED_BYTES} bytes)"
            ),
        }
    }
}

/// The plugin's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Keys the response object must have.
    pub required_keys: Vec<String>,
    /// What to do on failure.
    pub mode: Mode,
}

impl Settings {
    /// Reads the settings from the plugin's config.
    pub fn from_config() -> Self {
        let mode = match config("mode").as_deref().map(str::trim) {
            None | Some("reject") => Mode::Reject,
            Some("annotate") => Mode::Annotate,
            Some(other) => {
                log::error(&format!(
                    "`mode` must be \"reject\" or \"annotate\", not {other:?}; rejecting"
                ));
                Mode::Reject
            }
        };
        Self {
            required_keys: parse_keys(&config("required_keys").unwrap_or_default()),
            mode,
        }
    }
}

/// Splits `a, b,c` into keys; blanks are skipped.
pub fn parse_keys(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|key| !key.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Checks `text` against `required_keys`.
pub fn check(text: &str, required_keys: &[String]) -> Result<(), Problem> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|error| Problem::NotJson(error.to_string()))?;
    if required_keys.is_empty() {
        return Ok(());
    }
    let object = value.as_object().ok_or(Problem::NotAnObject)?;
    let missing: Vec<String> = required_keys
        .iter()
        .filter(|key| !object.contains_key(key.as_str()))
        .cloned()
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Problem::MissingKeys(missing))
    }
}

/// Applies `mode` to a check's outcome: `Err` to refuse, `Ok` to pass.
fn verdict(outcome: Result<(), Problem>, mode: Mode, note: &str) -> Result<(), Rejection> {
    let Err(problem) = outcome else {
        return Ok(());
    };
    match mode {
        Mode::Reject => {
            log::info(&format!("refused: {problem}{note}"));
            Err(Rejection::unprocessable(format!("{problem}{note}")))
        }
        Mode::Annotate => {
            log::warn(&format!("{problem}{note}"));
            Ok(())
        }
    }
}

/// Where a stream is.
#[derive(Debug, Default)]
enum Stream {
    /// Holding the text to check at the end.
    #[default]
    Buffering,
    /// Too long to check (annotate mode): passing text straight through.
    PassingThrough,
}

/// The plugin: for streams, the text held so far.
#[derive(Debug, Default)]
pub struct JsonGuard {
    buffered: String,
    stream: Stream,
}

impl Plugin for JsonGuard {
    fn on_response(&mut self, resp: Response) -> Result<Response, Rejection> {
        let settings = Settings::from_config();
        let note = if resp.finish_reason == "length" {
            " (generation stopped at the token limit)"
        } else {
            ""
        };
        verdict(
            check(&resp.text, &settings.required_keys),
            settings.mode,
            note,
        )?;
        Ok(resp)
    }

    fn on_chunk(&mut self, text: String) -> Result<String, Rejection> {
        if let Stream::PassingThrough = self.stream {
            return Ok(text);
        }
        if self.buffered.len() + text.len() <= MAX_BUFFERED_BYTES {
            self.buffered.push_str(&text);
            return Ok(String::new());
        }
        verdict(Err(Problem::TooLong), Settings::from_config().mode, "")?;
        self.stream = Stream::PassingThrough;
        let mut held = std::mem::take(&mut self.buffered);
        held.push_str(&text);
        Ok(held)
    }

    fn on_stream_end(&mut self) -> Result<String, Rejection> {
        if let Stream::PassingThrough = self.stream {
            return Ok(String::new());
        }
        let settings = Settings::from_config();
        verdict(
            check(&self.buffered, &settings.required_keys),
            settings.mode,
            "",
        )?;
        Ok(std::mem::take(&mut self.buffered))
    }
}

export_plugin!(JsonGuard);

#[cfg(test)]
mod tests {
    use super::*;
    use bulkhead_guest::testing;

    fn keys(list: &str) -> Vec<String> {
        parse_keys(list)
    }

    #[test]
    fn keys_are_split_and_trimmed() {
        assert_eq!(keys(" a, b ,,c "), ["a", "b", "c"]);
        assert!(keys("").is_empty());
    }

    #[test]
    fn any_json_passes_without_required_keys() {
        for text in ["1", "\"s\"", "[1, 2]", " {\"a\": null} \n", "null"] {
            assert_eq!(check(text, &[]), Ok(()), "{text}");
        }
    }

    #[test]
    fn invalid_json_fails() {
        for text in ["", "{", "{\"a\": 1,}", "```json\n{}\n```", "{} {}", "nope"] {
            assert!(
                matches!(check(text, &[]), Err(Problem::NotJson(_))),
                "{text}"
            );
        }
    }

    #[test]
    fn required_keys_need_an_object_with_them() {
        let required = keys("name,age");
        assert_eq!(
            check(r#"{"name": "x", "age": 3, "more": 1}"#, &required),
            Ok(())
        );
        assert_eq!(
            check(r#"{"name": "x"}"#, &required),
            Err(Problem::MissingKeys(keys("age")))
        );
        assert_eq!(check("[1]", &required), Err(Problem::NotAnObject));
        // Only top-level keys count.
        assert_eq!(
            check(r#"{"inner": {"name": 1, "age": 2}}"#, &required),
            Err(Problem::MissingKeys(keys("name,age")))
        );
    }

    #[test]
    fn reject_mode_refuses_with_422() {
        testing::set_config([("required_keys", "a")]);
        let err = JsonGuard::default()
            .on_response(Response::new("m", "{\"b\": 1}"))
            .unwrap_err();
        assert_eq!(err.status, 422);
        assert_eq!(err.message, "the response lacks required keys: a");
    }

    #[test]
    fn a_truncated_response_says_so() {
        testing::set_config::<&str, &str>([]);
        let mut resp = Response::new("m", "{\"a\": [1, 2");
        resp.finish_reason = "length".into();
        let err = JsonGuard::default().on_response(resp).unwrap_err();
        assert!(
            err.message
                .ends_with("(generation stopped at the token limit)"),
            "{err:?}"
        );
    }

    #[test]
    fn annotate_mode_passes_and_logs() {
        testing::set_config([("mode", "annotate")]);
        let resp = Response::new("m", "not json");
        assert_eq!(JsonGuard::default().on_response(resp.clone()), Ok(resp));
        let logs = testing::take_logs();
        assert_eq!(logs.len(), 1);
        assert_eq!(logs[0].0, log::Level::Warn);
    }

    #[test]
    fn unknown_mode_rejects_and_logs_an_error() {
        testing::set_config([("mode", "lenient")]);
        assert!(
            JsonGuard::default()
                .on_response(Response::new("m", "x"))
                .is_err()
        );
        assert_eq!(testing::take_logs()[0].0, log::Level::Error);
    }

    #[test]
    fn streams_are_buffered_and_released_whole() {
        testing::set_config([("required_keys", "a")]);
        let mut guard = JsonGuard::default();
        assert_eq!(guard.on_chunk("{\"a\"".into()), Ok(String::new()));
        assert_eq!(guard.on_chunk(": 1}".into()), Ok(String::new()));
        assert_eq!(guard.on_stream_end(), Ok("{\"a\": 1}".into()));
    }

    #[test]
    fn a_failing_stream_is_refused_at_the_end() {
        testing::set_config::<&str, &str>([]);
        let mut guard = JsonGuard::default();
        assert_eq!(guard.on_chunk("{\"a\"".into()), Ok(String::new()));
        assert_eq!(guard.on_stream_end().unwrap_err().status, 422);
    }

    #[test]
    fn an_overlong_stream_is_refused_or_passed_through() {
        let big = "x".repeat(MAX_BUFFERED_BYTES);

        testing::set_config::<&str, &str>([]);
        let mut guard = JsonGuard::default();
        assert_eq!(guard.on_chunk(big.clone()), Ok(String::new()));
        assert_eq!(guard.on_chunk("y".into()).unwrap_err().status, 422);

        testing::set_config([("mode", "annotate")]);
        let mut guard = JsonGuard::default();
        assert_eq!(guard.on_chunk(big.clone()), Ok(String::new()));
        assert_eq!(guard.on_chunk("y".into()), Ok(format!("{big}y")));
        assert_eq!(guard.on_chunk("z".into()), Ok("z".into()));
        assert_eq!(guard.on_stream_end(), Ok(String::new()));
    }
}
