//! Incremental decoding that never splits a UTF-8 sequence.

use super::Tokenizer;

/// Turns ids into text one at a time. Each `push` returns only complete
/// UTF-8; bytes of an unfinished character (say the first two of three
/// `<0xE2><0x82><0xAC>` byte tokens) wait for the next push. The
/// concatenation of all pushes and [`StreamDecoder::finish`] equals
/// [`Tokenizer::decode`] of the same ids.
#[derive(Debug)]
pub struct StreamDecoder<'t> {
    tokenizer: &'t Tokenizer,
    text: TextStream,
}

impl<'t> StreamDecoder<'t> {
    pub(super) fn new(tokenizer: &'t Tokenizer, strip_leading_space: bool) -> Self {
        Self {
            tokenizer,
            text: TextStream {
                pending: Vec::new(),
                strip_leading_space,
            },
        }
    }

    /// Adds one token; returns the text that is now complete.
    pub fn push(&mut self, id: u32) -> String {
        self.text.push(self.tokenizer, id)
    }

    /// Flushes whatever is left, replacing an unfinished character with U+FFFD.
    pub fn finish(self) -> String {
        self.text.finish()
    }

    /// The decoder's state without the borrow of the tokenizer, for a
    /// sequence that lives longer than one call (the batch scheduler).
    pub fn detach(self) -> TextStream {
        self.text
    }
}

/// A [`StreamDecoder`]'s state; each push is given the tokenizer.
#[derive(Debug)]
pub struct TextStream {
    pending: Vec<u8>,
    /// SentencePiece drops the space that starts the output.
    strip_leading_space: bool,
}

impl TextStream {
    /// Adds one token; returns the text that is now complete.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> String {
        let mut bytes = tokenizer.token_bytes(id).unwrap_or_default();
        if self.strip_leading_space && !bytes.is_empty() {
            self.strip_leading_space = false;
            if bytes[0] == b' ' {
                bytes = &bytes[1..];
            }
        }
        self.pending.extend_from_slice(bytes);
        self.take_complete()
    }

    /// Flushes whatever is left, replacing an unfinished character with U+FFFD.
    pub fn finish(mut self) -> String {
        let rest = std::mem::take(&mut self.pending);
        String::from_utf8_lossy(&rest).into_owned()
    }

    /// Emits the longest prefix of `pending` whose decoding cannot change:
    /// valid text, and invalid sequences (as U+FFFD, exactly as
    /// `String::from_utf8_lossy` would) — but not a truncated sequence at the end.
    fn take_complete(&mut self) -> String {
        let mut out = String::new();
        let mut consumed = 0;
        loop {
            match std::str::from_utf8(&self.pending[consumed..]) {
                Ok(valid) => {
                    out.push_str(valid);
                    consumed = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid_end = consumed + e.valid_up_to();
                    out.push_str(
                        std::str::from_utf8(&self.pending[consumed..valid_end]).unwrap_or_default(),
                    );
                    match e.error_len() {
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            consumed = valid_end + bad;
                        }
                        None => {
                            consumed = valid_end;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..consumed);
        out
    }
}
