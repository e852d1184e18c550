//! Hand-written scanners for the three kinds of personal data. Each looks at
//! one position of a text and decides whether a match starts there, or says
//! it needs more text to decide (streams). All three patterns are ASCII; a
//! non-ASCII character ends a match and counts as a boundary.

/// A kind of personal data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// `name@example.com`.
    Email,
    /// A payment card number: 13–19 digits, optionally grouped by single
    /// spaces or dashes, passing the Luhn check.
    Card,
    /// A phone number (see [`phone_at`] for the shapes).
    Phone,
}

impl Kind {
    /// Every kind, in the order scanners are tried at a position.
    pub const ALL: [Kind; 3] = [Kind::Email, Kind::Card, Kind::Phone];

    /// What a match is replaced with.
    pub fn replacement(self) -> &'static str {
        match self {
            Kind::Email => "[email]",
            Kind::Card => "[card]",
            Kind::Phone => "[phone]",
        }
    }

    /// The name used in config and logs.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Email => "email",
            Kind::Card => "card",
            Kind::Phone => "phone",
        }
    }
}

/// Whether the text after the buffer is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TextEnd {
    /// The buffer is the whole (rest of the) text.
    Known,
    /// More text may follow (a stream in progress).
    MayContinue,
}

/// The two characters before a position (scanners look back that far).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Behind {
    /// The character just before the position; `None` at the start.
    pub last: Option<char>,
    /// The one before that.
    pub before_last: Option<char>,
}

impl Behind {
    /// After `text` (at its end).
    pub fn of(text: &str) -> Self {
        let mut chars = text.chars().rev();
        let last = chars.next();
        Self {
            last,
            before_last: chars.next(),
        }
    }

    /// Moves one character on.
    pub fn push(&mut self, c: char) {
        self.before_last = self.last;
        self.last = Some(c);
    }
}

/// A scanner's answer at one position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A match from the position up to this byte offset (exclusive).
    Match(usize),
    /// No match starts here, whatever follows.
    NoMatch,
    /// The answer depends on text after the buffer's end.
    NeedMore,
}

/// RFC 5321 limits: they bound how far the email scanner looks.
const MAX_LOCAL_BYTES: usize = 64;
const MAX_DOMAIN_BYTES: usize = 255;
const MAX_LABEL_BYTES: usize = 63;

/// The longest text a scanner can need before it decides: an email with the
/// longest local part and domain. A stream never holds back more than this.
pub const MAX_UNDECIDED_BYTES: usize = MAX_LOCAL_BYTES + 1 + MAX_DOMAIN_BYTES;

const CARD_MIN_DIGITS: usize = 13;
const CARD_MAX_DIGITS: usize = 19;
/// E.164: at most 15 digits in a phone number.
const PHONE_MAX_DIGITS: usize = 15;

/// Runs the scanner for `kind` at `pos`, a char boundary of `text`;
/// `behind` holds the characters before `pos`.
pub fn scan(kind: Kind, text: &[u8], pos: usize, behind: Behind, end: TextEnd) -> Outcome {
    match kind {
        Kind::Email => email_at(text, pos, behind, end),
        Kind::Card => card_at(text, pos, behind, end),
        Kind::Phone => phone_at(text, pos, behind, end),
    }
}

/// Reads one byte ahead: `Err` carries the outcome when the buffer ended.
fn peek(text: &[u8], at: usize, end: TextEnd) -> Result<Option<u8>, Outcome> {
    match (text.get(at), end) {
        (Some(&byte), _) => Ok(Some(byte)),
        (None, TextEnd::Known) => Ok(None),
        (None, TextEnd::MayContinue) => Err(Outcome::NeedMore),
    }
}

fn is_alnum(c: Option<char>) -> bool {
    c.is_some_and(|c| c.is_ascii_alphanumeric())
}

fn is_local_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'%' | b'+' | b'-')
}

fn is_domain_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-')
}

/// An email address: a local part (letters, digits, `._%+-`, at most 64)
/// starting where the previous character cannot be part of it (a `.` before
/// it is left out), `@`, and a domain of at least two dot-separated labels
/// (letters, digits, inner `-`, at most 63 each, 255 in all) ending in a
/// top-level domain of two or more letters. Dots and dashes trailing the
/// domain are not part of it (`write to a@b.com.`), but count towards the
/// 255-byte limit on the run of domain characters, which bounds how much a
/// stream holds back.
pub fn email_at(text: &[u8], pos: usize, behind: Behind, end: TextEnd) -> Outcome {
    try_email(text, pos, behind, end).unwrap_or_else(|outcome| outcome)
}

fn try_email(text: &[u8], pos: usize, behind: Behind, end: TextEnd) -> Result<Outcome, Outcome> {
    let starts_run = match behind.last {
        Some(c) => c == '.' || !c.is_ascii() || !is_local_byte(c as u8),
        None => true,
    };
    if !starts_run || text[pos] == b'.' || !is_local_byte(text[pos]) {
        return Ok(Outcome::NoMatch);
    }
    let mut at = pos;
    while let Some(b) = peek(text, at, end)? {
        if !is_local_byte(b) {
            break;
        }
        at += 1;
        if at - pos > MAX_LOCAL_BYTES {
            return Ok(Outcome::NoMatch);
        }
    }
    if text.get(at) != Some(&b'@') {
        return Ok(Outcome::NoMatch);
    }
    let domain_start = at + 1;
    let mut domain_end = domain_start;
    while let Some(b) = peek(text, domain_end, end)? {
        if !is_domain_byte(b) {
            break;
        }
        domain_end += 1;
        if domain_end - domain_start > MAX_DOMAIN_BYTES {
            return Ok(Outcome::NoMatch);
        }
    }
    while domain_end > domain_start && matches!(text[domain_end - 1], b'.' | b'-') {
        domain_end -= 1;
    }
    Ok(if is_domain(&text[domain_start..domain_end]) {
        Outcome::Match(domain_end)
    } else {
        Outcome::NoMatch
    })
}

fn is_domain(domain: &[u8]) -> bool {
    let labels: Vec<&[u8]> = domain.split(|&b| b == b'.').collect();
    let label_ok = |label: &&[u8]| {
        (1..=MAX_LABEL_BYTES).contains(&label.len())
            && label.first() != Some(&b'-')
            && label.last() != Some(&b'-')
    };
    let tld = labels.last().copied().unwrap_or_default();
    labels.len() >= 2
        && labels.iter().all(label_ok)
        && tld.len() >= 2
        && tld.iter().all(u8::is_ascii_alphabetic)
}

/// A payment card number: 13–19 digits, in groups separated by single
/// spaces or dashes, starting after a non-alphanumeric character, ending at
/// a group's end not followed by a letter or digit, passing the Luhn check.
/// When a run of digit groups has several such prefixes, the longest wins
/// (a card followed by more numbers, `4111 1111 1111 1111 123`, still
/// matches; the `123` stays).
pub fn card_at(text: &[u8], pos: usize, behind: Behind, end: TextEnd) -> Outcome {
    try_card(text, pos, behind, end).unwrap_or_else(|outcome| outcome)
}

fn try_card(text: &[u8], pos: usize, behind: Behind, end: TextEnd) -> Result<Outcome, Outcome> {
    if is_alnum(behind.last) || !text[pos].is_ascii_digit() {
        return Ok(Outcome::NoMatch);
    }
    let mut digits = [0u8; CARD_MAX_DIGITS];
    // ends[k]: where a card of the first k digits would end, when it may.
    let mut ends = [None; CARD_MAX_DIGITS + 1];
    let mut count = 0;
    let mut at = pos;
    loop {
        digits[count] = text[at] - b'0';
        count += 1;
        at += 1;
        let next = peek(text, at, end)?;
        if next.is_some_and(|b| b.is_ascii_digit()) {
            if count == CARD_MAX_DIGITS {
                break;
            }
            continue;
        }
        if !next.is_some_and(|b| b.is_ascii_alphanumeric()) {
            ends[count] = Some(at);
        }
        if count == CARD_MAX_DIGITS || !matches!(next, Some(b' ' | b'-')) {
            break;
        }
        match peek(text, at + 1, end)? {
            Some(b) if b.is_ascii_digit() => at += 1,
            _ => break,
        }
    }
    let longest = (CARD_MIN_DIGITS..=count)
        .rev()
        .find_map(|k| ends[k].filter(|_| luhn_valid(&digits[..k])));
    Ok(longest.map_or(Outcome::NoMatch, Outcome::Match))
}

/// The Luhn checksum: from the right, every second digit doubled (minus 9
/// when over 9); the sum must be a multiple of 10.
pub fn luhn_valid(digits: &[u8]) -> bool {
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &d)| {
            let d = u32::from(d);
            match (i % 2, d * 2) {
                (0, _) => d,
                (_, doubled) if doubled > 9 => doubled - 9,
                (_, doubled) => doubled,
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

/// One group of digits in a phone number.
#[derive(Clone, Copy, Debug)]
struct Group {
    digits: usize,
    parenthesized: bool,
}

/// A phone number, in one of two shapes, starting after a character that is
/// not a letter, digit or `+`, nor a separator after a digit (so the tail of
/// a longer number, `4111 1111 1111 1112`, is not taken for one):
///
/// - international: `+`, then 8–15 digits in any grouping
///   (`+44 20 7946 0958`, `+4915112345678`, `+1 (555) 123-4567`);
/// - national: 10–15 digits in three or more groups of 1–4 digits, at most
///   one of them a single digit (`(555) 123-4567`, `555.123.4567`,
///   `020 7946 0958`, `1-800-555-0199`).
///
/// Groups are separated by one space, `-` or `.`, or follow a parenthesized
/// group directly (`(555)123-4567`). Left alone, because they are far more
/// often something else: bare digit runs without `+` (ids, timestamps),
/// numbers grouped in thousands (`1 234 567 890`), dotted groups not ending
/// in four digits (IP addresses), and anything followed by a letter, digit,
/// `@`, `_`, `:` or `/`, or by `,`/`.` and a digit (times, decimals).
pub fn phone_at(text: &[u8], pos: usize, behind: Behind, end: TextEnd) -> Outcome {
    try_phone(text, pos, behind, end).unwrap_or_else(|outcome| outcome)
}

fn try_phone(text: &[u8], pos: usize, behind: Behind, end: TextEnd) -> Result<Outcome, Outcome> {
    let inside_digit_groups = matches!(behind.last, Some(' ' | '-' | '.'))
        && behind.before_last.is_some_and(|c| c.is_ascii_digit());
    if is_alnum(behind.last)
        || behind.last == Some('+')
        || inside_digit_groups
        || !matches!(text[pos], b'+' | b'(' | b'0'..=b'9')
    {
        return Ok(Outcome::NoMatch);
    }
    let international = text[pos] == b'+';
    let mut at = pos + usize::from(international);
    let mut groups: Vec<Group> = Vec::new();
    let mut separators: Vec<u8> = Vec::new();
    // The separator read after the last group, kept once another follows.
    let mut separator = None;
    let mut total_digits = 0;
    // Where the number ends: after its last complete group.
    let mut number_end = pos;
    loop {
        let parenthesized = peek(text, at, end)? == Some(b'(');
        at += usize::from(parenthesized);
        let digits_start = at;
        while peek(text, at, end)?.is_some_and(|b| b.is_ascii_digit()) {
            at += 1;
            if total_digits + (at - digits_start) > PHONE_MAX_DIGITS {
                return Ok(Outcome::NoMatch);
            }
        }
        let digits = at - digits_start;
        let closed = !parenthesized || peek(text, at, end)? == Some(b')');
        if digits == 0 || !closed {
            break;
        }
        at += usize::from(parenthesized);
        total_digits += digits;
        groups.push(Group {
            digits,
            parenthesized,
        });
        separators.extend(separator.take());
        number_end = at;
        match peek(text, at, end)? {
            Some(sep @ (b' ' | b'-' | b'.')) => match peek(text, at + 1, end)? {
                Some(b'0'..=b'9' | b'(') => {
                    separator = Some(sep);
                    at += 1;
                }
                _ => break,
            },
            Some(b'0'..=b'9' | b'(') if parenthesized => {}
            _ => break,
        }
    }
    if groups.is_empty() || !phone_shape(international, &groups, &separators, total_digits) {
        return Ok(Outcome::NoMatch);
    }
    let ends_cleanly = match peek(text, number_end, end)? {
        None => true,
        Some(b) if b.is_ascii_alphanumeric() || matches!(b, b'@' | b'_' | b':' | b'/') => false,
        Some(b',' | b'.') => !peek(text, number_end + 1, end)?.is_some_and(|b| b.is_ascii_digit()),
        Some(_) => true,
    };
    Ok(if ends_cleanly {
        Outcome::Match(number_end)
    } else {
        Outcome::NoMatch
    })
}

fn phone_shape(international: bool, groups: &[Group], separators: &[u8], digits: usize) -> bool {
    if international {
        return (8..=PHONE_MAX_DIGITS).contains(&digits);
    }
    let single_digit_groups = groups.iter().filter(|g| g.digits == 1).count();
    let thousands = groups.len() >= 2
        && groups[0].digits <= 3
        && groups[1..].iter().all(|g| g.digits == 3)
        && !groups.iter().any(|g| g.parenthesized);
    let dotted_quad_like = !separators.is_empty()
        && separators.iter().all(|&s| s == b'.')
        && groups.last().is_some_and(|g| g.digits != 4);
    (10..=PHONE_MAX_DIGITS).contains(&digits)
        && groups.len() >= 3
        && groups.iter().all(|g| g.digits <= 4)
        && single_digit_groups <= 1
        && !thousands
        && !dotted_quad_like
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The match starting at the first byte of `text`, the whole text known.
    fn matched(kind: Kind, text: &str) -> Option<&str> {
        match scan(kind, text.as_bytes(), 0, Behind::default(), TextEnd::Known) {
            Outcome::Match(end) => Some(&text[..end]),
            Outcome::NoMatch => None,
            Outcome::NeedMore => unreachable!("the text is known"),
        }
    }

    #[test]
    fn emails() {
        for (text, want) in [
            ("a@b.co", "a@b.co"),
            (
                "john.doe+tag@mail.example.com rest",
                "john.doe+tag@mail.example.com",
            ),
            (
                "x_y%z-1@sub-domain.example.org.",
                "x_y%z-1@sub-domain.example.org",
            ),
            ("a@b.com-", "a@b.com"),
            ("a@b.com>", "a@b.com"),
        ] {
            assert_eq!(matched(Kind::Email, text), Some(want), "{text}");
        }
        for text in [
            "a@b",
            "a@b.c",
            "a@b.c0m",
            "a@-b.com",
            "a@b-.com",
            "a@b..com",
            "@b.com",
            ".a@b.com",
            "a b@c.com",
            "a@.com",
        ] {
            assert_eq!(matched(Kind::Email, text), None, "{text}");
        }
    }

    #[test]
    fn email_limits() {
        let local = "l".repeat(MAX_LOCAL_BYTES);
        let email = format!("{local}@example.com");
        assert_eq!(matched(Kind::Email, &email), Some(email.as_str()));
        assert_eq!(matched(Kind::Email, &format!("l{email}")), None);

        let label = "d".repeat(MAX_LABEL_BYTES);
        let domain = format!("{label}.{label}.{label}.{}.com", "d".repeat(59));
        assert_eq!(domain.len(), MAX_DOMAIN_BYTES);
        let email = format!("{local}@{domain}");
        assert_eq!(email.len(), MAX_UNDECIDED_BYTES);
        assert_eq!(matched(Kind::Email, &email), Some(email.as_str()));
        assert_eq!(matched(Kind::Email, &format!("{local}@d{domain}")), None);
        assert_eq!(
            matched(Kind::Email, &format!("a@{}.com", "d".repeat(64))),
            None
        );
    }

    #[test]
    fn emails_start_where_a_run_starts() {
        let text = b"xa@b.com";
        // Inside the run `xa`: not a start.
        assert_eq!(
            email_at(text, 1, Behind::of("x"), TextEnd::Known),
            Outcome::NoMatch
        );
        // After a dot: a start (the dot is left out).
        assert_eq!(
            email_at(text, 1, Behind::of("."), TextEnd::Known),
            Outcome::Match(8)
        );
        assert_eq!(
            email_at(text, 1, Behind::of("é"), TextEnd::Known),
            Outcome::Match(8)
        );
    }

    #[test]
    fn luhn() {
        assert!(luhn_valid(&[
            4, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1
        ]));
        assert!(!luhn_valid(&[
            4, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2
        ]));
        assert!(luhn_valid(&[7, 9, 9, 2, 7, 3, 9, 8, 7, 1, 3]));
    }

    #[test]
    fn cards() {
        for (text, want) in [
            ("4111111111111111", "4111111111111111"),
            ("4111 1111 1111 1111.", "4111 1111 1111 1111"),
            ("5555-5555-5555-4444 ok", "5555-5555-5555-4444"),
            ("3782 822463 10005", "3782 822463 10005"),
            ("6011111111111117", "6011111111111117"),
            ("4222222222222", "4222222222222"),
            // The longest valid prefix ending at a group's end.
            ("4111 1111 1111 1111 123", "4111 1111 1111 1111"),
            ("4111111111111111 4111", "4111111111111111"),
        ] {
            assert_eq!(matched(Kind::Card, text), Some(want), "{text}");
        }
        for text in [
            "4111111111111112",
            "411111111111",
            "4111111111111111x",
            "41111111111111111111",
            "4111  1111 1111 1111",
            "4111_1111_1111_1111",
            "1234 5678 9012 3456",
        ] {
            assert_eq!(matched(Kind::Card, text), None, "{text}");
        }
        // Not after a letter or digit.
        assert_eq!(
            card_at(b"4111111111111111", 0, Behind::of("a"), TextEnd::Known),
            Outcome::NoMatch
        );
        assert_eq!(
            card_at(b"4111111111111111", 0, Behind::of("-"), TextEnd::Known),
            Outcome::Match(16)
        );
    }

    #[test]
    fn phones() {
        for (text, want) in [
            ("+44 20 7946 0958", "+44 20 7946 0958"),
            ("+4915112345678.", "+4915112345678"),
            ("+1 (555) 123-4567, call", "+1 (555) 123-4567"),
            ("+33 1 23 45 67 89", "+33 1 23 45 67 89"),
            ("(555) 123-4567", "(555) 123-4567"),
            ("(555)123-4567", "(555)123-4567"),
            ("555-123-4567", "555-123-4567"),
            ("555.123.4567 ", "555.123.4567"),
            ("020 7946 0958", "020 7946 0958"),
            ("1-800-555-0199!", "1-800-555-0199"),
            ("555-123-4567 - thanks", "555-123-4567"),
            ("555-123-4567 (home)", "555-123-4567"),
        ] {
            assert_eq!(matched(Kind::Phone, text), Some(want), "{text}");
        }
        for text in [
            "5551234567",
            "+1234567",
            "555-1234",
            "2024-01-15",
            "2024-01-15 10:30",
            "192.168.100.200",
            "1 234 567 890",
            "3.14159265358",
            "1 2 3 4 5 6 7 8 9 10",
            "555-123-4567x",
            "555-123-4567:",
            "555-123-4567,5",
            "555-123-4567@x.com",
            "+1 555 123 4567 8901 2345",
            "(555 123-4567",
        ] {
            assert_eq!(matched(Kind::Phone, text), None, "{text}");
        }
        for before in ["+", "1 ", "1-", "1."] {
            let behind = Behind::of(before);
            assert_eq!(
                phone_at(b"555-123-4567", 0, behind, TextEnd::Known),
                Outcome::NoMatch
            );
        }
        let behind = Behind::of("a ");
        assert_eq!(
            phone_at(b"555-123-4567", 0, behind, TextEnd::Known),
            Outcome::Match(12)
        );
    }

    #[test]
    fn undecided_at_the_buffer_end() {
        let more = |kind, text: &str| {
            scan(
                kind,
                text.as_bytes(),
                0,
                Behind::default(),
                TextEnd::MayContinue,
            )
        };
        assert_eq!(more(Kind::Email, "john"), Outcome::NeedMore);
        assert_eq!(more(Kind::Email, "john@example.com"), Outcome::NeedMore);
        assert_eq!(more(Kind::Email, "john@example.com."), Outcome::NeedMore);
        assert_eq!(more(Kind::Email, "john@example.com "), Outcome::Match(16));
        assert_eq!(more(Kind::Email, "john "), Outcome::NoMatch);
        assert_eq!(more(Kind::Card, "4111 1111 1111 1111"), Outcome::NeedMore);
        assert_eq!(more(Kind::Card, "4111 1111 1111 1111 "), Outcome::NeedMore);
        assert_eq!(
            more(Kind::Card, "4111 1111 1111 1111 x"),
            Outcome::Match(19)
        );
        assert_eq!(more(Kind::Card, "12 x"), Outcome::NoMatch);
        assert_eq!(more(Kind::Phone, "+"), Outcome::NeedMore);
        assert_eq!(more(Kind::Phone, "(555) 123-4567"), Outcome::NeedMore);
        assert_eq!(more(Kind::Phone, "(555) 123-4567 "), Outcome::NeedMore);
        assert_eq!(more(Kind::Phone, "(555) 123-4567 x"), Outcome::Match(14));
        assert_eq!(more(Kind::Phone, "555 x"), Outcome::NoMatch);
    }
}
