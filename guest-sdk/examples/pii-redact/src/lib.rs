//! Redacts email addresses, phone numbers and payment card numbers in
//! prompts and in the model's output.
//!
//! - `on_request`: every chat message (any role) and text prompts. Token-id
//!   prompts pass unchanged.
//! - `on_response`: the response text.
//! - Streams: each delta is redacted as it passes, except for text that
//!   could still become (part of) a match with what comes next: that is held
//!   back and sent with the next delta or at the end of the stream. In
//!   practice that is the last word or number of a delta; never more than
//!   [`scan::MAX_UNDECIDED_BYTES`] (320) bytes, the longest possible email
//!   address, which is the longest match. The redacted stream is the same
//!   however the model's text is split into deltas.
//!
//! Matches are replaced by `[email]`, `[phone]` and `[card]`; what each
//! pattern accepts is documented on [`scan::email_at`], [`scan::phone_at`]
//! and [`scan::card_at`]. The counts (never the data) are logged at info
//! level.
//!
//! Config (the plugin's table in the tenant policy):
//!
//! - `redact`: which kinds, comma-separated: `"email,phone,card"` (the
//!   default, also when blank). An unknown name makes the plugin redact every
//!   kind and log an error, so a typo never turns redaction off.

pub mod redact;
pub mod scan;

use bulkhead_guest::{Plugin, Rejection, Request, Response, config, export_plugin, log};

use crate::redact::{Counts, Kinds, Redactor, redact};

/// Reads `redact` from the plugin's config.
fn kinds_from_config() -> Kinds {
    let list = config("redact").unwrap_or_default();
    Kinds::parse(&list).unwrap_or_else(|unknown| {
        log::error(&format!(
            "`redact`: unknown kind {unknown:?} (known: email, phone, card); redacting every kind"
        ));
        Kinds::ALL
    })
}

fn log_counts(place: &str, counts: Counts) {
    if let Some(summary) = counts.summary() {
        log::info(&format!("redacted in {place}: {summary}"));
    }
}

/// The plugin: for streams, the redactor with the held-back text.
#[derive(Debug, Default)]
pub struct PiiRedact {
    stream: Option<Redactor>,
}

impl Plugin for PiiRedact {
    fn on_request(&mut self, mut req: Request) -> Result<Request, Rejection> {
        let kinds = kinds_from_config();
        let mut counts = Counts::default();
        for text in req.prompt.texts_mut() {
            *text = redact(text, kinds, &mut counts);
        }
        log_counts("prompt", counts);
        Ok(req)
    }

    fn on_response(&mut self, mut resp: Response) -> Result<Response, Rejection> {
        let mut counts = Counts::default();
        resp.text = redact(&resp.text, kinds_from_config(), &mut counts);
        log_counts("response", counts);
        Ok(resp)
    }

    fn on_chunk(&mut self, text: String) -> Result<String, Rejection> {
        let redactor = self
            .stream
            .get_or_insert_with(|| Redactor::new(kinds_from_config()));
        Ok(redactor.push(&text))
    }

    fn on_stream_end(&mut self) -> Result<String, Rejection> {
        let Some(mut redactor) = self.stream.take() else {
            return Ok(String::new());
        };
        let rest = redactor.finish();
        log_counts("stream", redactor.counts());
        Ok(rest)
    }
}

export_plugin!(PiiRedact);

#[cfg(test)]
mod tests;
