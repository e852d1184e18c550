//! Whole texts, streams split every possible way, and the hooks.

use bulkhead_guest::{Message, Prompt, testing};

use super::*;
use crate::scan::{Kind, MAX_UNDECIDED_BYTES};

fn redact_all(text: &str) -> String {
    redact(text, Kinds::ALL, &mut Counts::default())
}

/// Feeds `pieces` to a redactor, checking the hold-back bound after each.
fn redact_stream<'a>(pieces: impl IntoIterator<Item = &'a str>) -> String {
    let mut redactor = Redactor::new(Kinds::ALL);
    let mut out = String::new();
    for piece in pieces {
        out.push_str(&redactor.push(piece));
        assert!(redactor.pending_len() <= MAX_UNDECIDED_BYTES);
    }
    out.push_str(&redactor.finish());
    out
}

/// Splits `text` at every pair of char boundaries (three pieces) and checks
/// each stream comes out as the whole text does.
fn assert_split_invariant(text: &str) {
    let whole = redact_all(text);
    let bounds: Vec<usize> = (0..=text.len())
        .filter(|&i| text.is_char_boundary(i))
        .collect();
    for (n, &i) in bounds.iter().enumerate() {
        for &j in &bounds[n..] {
            let streamed = redact_stream([&text[..i], &text[i..j], &text[j..]]);
            assert_eq!(streamed, whole, "split at {i} and {j}: {text:?}");
        }
    }
}

#[test]
fn whole_texts() {
    assert_eq!(
        redact_all("Mail jane.doe@example.com or call +1 (555) 123-4567."),
        "Mail [email] or call [phone]."
    );
    assert_eq!(
        redact_all("Card: 4111 1111 1111 1111, exp 12/27. Not a card: 4111 1111 1111 1112."),
        "Card: [card], exp 12/27. Not a card: 4111 1111 1111 1112."
    );
    assert_eq!(
        redact_all("Order 12345678, born 1990-04-01, ip 10.0.0.1, 3.14159"),
        "Order 12345678, born 1990-04-01, ip 10.0.0.1, 3.14159"
    );
    assert_eq!(redact_all("Grüße an ana@ex.de!"), "Grüße an [email]!");
    assert_eq!(redact_all(""), "");
}

#[test]
fn counts_by_kind() {
    let mut counts = Counts::default();
    redact(
        "a@b.co c@d.co 4111111111111111, 555-123-4567",
        Kinds::ALL,
        &mut counts,
    );
    assert_eq!(counts.get(Kind::Email), 2);
    assert_eq!(counts.get(Kind::Card), 1);
    assert_eq!(counts.get(Kind::Phone), 1);
    assert_eq!(
        counts.summary().as_deref(),
        Some("email 2, card 1, phone 1")
    );
    assert_eq!(Counts::default().summary(), None);
}

#[test]
fn only_the_configured_kinds() {
    let kinds = Kinds::parse("email, card").unwrap();
    let text = "a@b.co 4111111111111111 555-123-4567";
    assert_eq!(
        redact(text, kinds, &mut Counts::default()),
        "[email] [card] 555-123-4567"
    );
    assert_eq!(Kinds::parse(""), Ok(Kinds::ALL));
    assert_eq!(Kinds::parse("emails"), Err("emails".to_owned()));
}

#[test]
fn a_match_split_across_chunks_is_caught() {
    assert_eq!(
        redact_stream(["write to jo", "hn@exa", "mple.com", " today"]),
        "write to [email] today"
    );
    assert_eq!(
        redact_stream(["4111 1111 ", "1111 1111", " thanks"]),
        "[card] thanks"
    );
    assert_eq!(redact_stream(["+44 20 79", "46 0958"]), "[phone]");
}

#[test]
fn text_is_released_as_soon_as_it_is_decided() {
    let mut redactor = Redactor::new(Kinds::ALL);
    assert_eq!(redactor.push("Hello wor"), "Hello ");
    assert_eq!(redactor.push("ld, how"), "world, ");
    assert_eq!(redactor.push(" are you?"), "how are you?");
    assert_eq!(redactor.finish(), "");
}

#[test]
fn the_longest_undecided_text_is_an_email() {
    let local = "l".repeat(64);
    let label = "d".repeat(63);
    let domain = format!("{label}.{label}.{label}.{}.com", "d".repeat(59));
    let email = format!("{local}@{domain}");
    assert_eq!(email.len(), MAX_UNDECIDED_BYTES);
    let mut redactor = Redactor::new(Kinds::ALL);
    assert_eq!(redactor.push(&format!("x {email}")), "x ");
    assert_eq!(redactor.pending_len(), MAX_UNDECIDED_BYTES);
    assert_eq!(redactor.push(" "), "[email] ");
    // One more domain byte and it cannot be an email: all of it goes out.
    let mut redactor = Redactor::new(Kinds::ALL);
    let mut out = redactor.push(&format!("{email}d "));
    out += &redactor.finish();
    assert_eq!(out, format!("{email}d "));
}

#[test]
fn streams_match_whole_texts_however_split() {
    for text in [
        "Mail jane.doe@example.com or call +1 (555) 123-4567.",
        "Card 4111-1111-1111-1111 and 5555 5555 5555 4444!",
        "x@y.z a@b.com. (555)123-4567 4111111111111111 4111",
        "ids 5551234567 2024-01-15 10:30 192.168.100.200 1 234 567 890",
        "é@é.com ü4111111111111111 +4915112345678",
    ] {
        assert_split_invariant(text);
    }
}

/// A small deterministic generator (xorshift), so the test needs no crate.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

#[test]
fn random_texts_stream_like_whole_texts() {
    const ALPHABET: &[&str] = &[
        "0", "1", "4", "5", "9", " ", "-", ".", "(", ")", "+", "@", "a", "b", "co", "m", "x", ",",
        ":", "é", "\n", "4111", "1111", "555", "@ex.com", "user",
    ];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..3000 {
        let text: String = (0..rng.below(40))
            .map(|_| ALPHABET[rng.below(ALPHABET.len())])
            .collect();
        let whole = redact_all(&text);
        let mut pieces = Vec::new();
        let mut rest = text.as_str();
        while !rest.is_empty() {
            let mut cut = rng.below(rest.len() + 1);
            while !rest.is_char_boundary(cut) {
                cut -= 1;
            }
            let (piece, tail) = rest.split_at(cut);
            pieces.push(piece);
            rest = tail;
        }
        assert_eq!(
            redact_stream(pieces.iter().copied()),
            whole,
            "{text:?} as {pieces:?}"
        );
    }
}

#[test]
fn hooks_redact_prompts_responses_and_streams() {
    testing::set_config::<&str, &str>([]);
    let mut plugin = PiiRedact::default();
    let req = Request::new(
        "m",
        Prompt::Chat(vec![
            Message::system("Support for a@b.co"),
            Message::user("My card is 4111 1111 1111 1111"),
        ]),
    );
    let req = plugin.on_request(req).unwrap();
    assert_eq!(
        req.prompt.texts(),
        ["Support for [email]", "My card is [card]"]
    );
    let logs = testing::take_logs();
    assert_eq!(logs[0].1, "redacted in prompt: email 1, card 1");

    let resp = plugin
        .on_response(Response::new("m", "Call 555-123-4567"))
        .unwrap();
    assert_eq!(resp.text, "Call [phone]");

    let mut plugin = PiiRedact::default();
    let mut out = plugin.on_chunk("Reach me at 555-12".into()).unwrap();
    out += &plugin.on_chunk("3-4567 or x".into()).unwrap();
    out += &plugin.on_chunk("@y.org".into()).unwrap();
    out += &plugin.on_stream_end().unwrap();
    assert_eq!(out, "Reach me at [phone] or [email]");
}

#[test]
fn hook_with_a_typo_in_config_redacts_everything() {
    testing::set_config([("redact", "emial")]);
    let resp = PiiRedact::default()
        .on_response(Response::new("m", "a@b.co 555-123-4567"))
        .unwrap();
    assert_eq!(resp.text, "[email] [phone]");
    assert_eq!(testing::take_logs()[0].0, log::Level::Error);
}
