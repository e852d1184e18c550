//! Redaction of whole texts and of streams, which must hold back text that
//! could still turn out to be (part of) a match.

use crate::scan::{Behind, Kind, MAX_UNDECIDED_BYTES, Outcome, TextEnd, scan};

/// Which kinds to redact.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kinds([bool; Kind::ALL.len()]);

impl Kinds {
    /// Every kind.
    pub const ALL: Kinds = Kinds([true; Kind::ALL.len()]);

    /// Reads a comma-separated list of kind names (`email`, `phone`,
    /// `card`). A blank list means every kind; an unknown name is returned
    /// as the error.
    pub fn parse(list: &str) -> Result<Self, String> {
        let mut kinds = [false; Kind::ALL.len()];
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let kind = Kind::ALL
                .into_iter()
                .find(|kind| kind.name() == name)
                .ok_or_else(|| name.to_owned())?;
            kinds[kind as usize] = true;
        }
        Ok(if kinds.contains(&true) {
            Kinds(kinds)
        } else {
            Kinds::ALL
        })
    }

    fn iter(self) -> impl Iterator<Item = Kind> {
        Kind::ALL
            .into_iter()
            .filter(move |&kind| self.0[kind as usize])
    }
}

/// How many matches of each kind were redacted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts([usize; Kind::ALL.len()]);

impl Counts {
    /// Matches of `kind`.
    pub fn get(&self, kind: Kind) -> usize {
        self.0[kind as usize]
    }

    /// `email 2, card 1`; `None` when nothing was redacted.
    pub fn summary(&self) -> Option<String> {
        let parts: Vec<String> = Kind::ALL
            .into_iter()
            .filter(|&kind| self.get(kind) > 0)
            .map(|kind| format!("{} {}", kind.name(), self.get(kind)))
            .collect();
        (!parts.is_empty()).then(|| parts.join(", "))
    }
}

/// Redacts a text that arrives in pieces. Text is sent on as soon as no
/// scanner needs more of it to decide: in practice everything but the last
/// word or number, and never more than [`MAX_UNDECIDED_BYTES`] held back.
/// The output is the same however the text is split.
#[derive(Clone, Debug)]
pub struct Redactor {
    kinds: Kinds,
    /// Text received but not yet decided.
    pending: String,
    /// The original characters before `pending` (scanners look back).
    behind: Behind,
    counts: Counts,
}

impl Redactor {
    /// A redactor at the start of a text.
    pub fn new(kinds: Kinds) -> Self {
        Self {
            kinds,
            pending: String::new(),
            behind: Behind::default(),
            counts: Counts::default(),
        }
    }

    /// Takes the next piece of text; returns what can be sent now.
    pub fn push(&mut self, text: &str) -> String {
        self.pending.push_str(text);
        let out = self.drain(TextEnd::MayContinue);
        debug_assert!(self.pending.len() <= MAX_UNDECIDED_BYTES);
        out
    }

    /// The text ended: returns the rest.
    pub fn finish(&mut self) -> String {
        self.drain(TextEnd::Known)
    }

    /// What was redacted so far.
    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// How many bytes are held back.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    fn drain(&mut self, end: TextEnd) -> String {
        let text = std::mem::take(&mut self.pending);
        let bytes = text.as_bytes();
        let mut out = String::with_capacity(text.len());
        let mut pos = 0;
        'text: while pos < bytes.len() {
            for kind in self.kinds.iter() {
                match scan(kind, bytes, pos, self.behind, end) {
                    Outcome::Match(match_end) => {
                        out.push_str(kind.replacement());
                        self.counts.0[kind as usize] += 1;
                        // Matches are ASCII: their bytes are chars.
                        self.behind = Behind::of(&text[pos..match_end]);
                        pos = match_end;
                        continue 'text;
                    }
                    Outcome::NeedMore => {
                        self.pending = text[pos..].to_owned();
                        return out;
                    }
                    Outcome::NoMatch => {}
                }
            }
            let c = text[pos..].chars().next().unwrap_or_default();
            out.push(c);
            self.behind.push(c);
            pos += c.len_utf8();
        }
        out
    }
}

/// Redacts a whole text, adding what it found to `counts`.
pub fn redact(text: &str, kinds: Kinds, counts: &mut Counts) -> String {
    let mut redactor = Redactor::new(kinds);
    let mut out = redactor.push(text);
    out.push_str(&redactor.finish());
    for kind in Kind::ALL {
        counts.0[kind as usize] += redactor.counts().get(kind);
    }
    out
}
