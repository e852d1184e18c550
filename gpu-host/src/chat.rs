//! Chat templates: `tokenizer.chat_template` (Jinja) rendered with minijinja
//! the way Hugging Face transformers renders it.

use std::io;
use std::time::{SystemTime, UNIX_EPOCH};

use std::sync::Arc;

use minijinja::value::{Enumerator, Kwargs, Object, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

use crate::gguf::{GgufError, Metadata};
use crate::tokenizer::{LITERAL_END, LITERAL_START, Tokenizer};

/// Largest template source accepted. Real templates are under 20 KiB.
pub const MAX_TEMPLATE_BYTES: usize = 256 * 1024;
/// Most bytes one render may produce, so a hostile template cannot make us
/// buffer gigabytes; far above any prompt a model's context can hold.
pub const MAX_RENDERED_BYTES: usize = 16 * 1024 * 1024;
/// Instruction budget for one render, so a hostile template cannot spin
/// forever. A Llama 3 or Qwen2 template spends a few hundred per message.
pub const RENDER_FUEL: u64 = 5_000_000;
/// Deepest macro/include/block nesting; real templates nest only a few levels.
pub const MAX_TEMPLATE_RECURSION: usize = 64;

/// ChatML, used when a model has no template of its own.
const CHATML_TEMPLATE: &str = "{% for message in messages %}\
{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}\
{% endfor %}\
{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

const TEMPLATE_NAME: &str = "chat_template";

/// One chat turn.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, ...
    pub role: String,
    /// The message text.
    pub content: String,
}

/// Why a template could not be compiled or rendered.
#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateError {
    /// The model's template is larger than [`MAX_TEMPLATE_BYTES`] (model file's fault).
    #[error("chat template is {len} bytes, more than the limit of {max}")]
    TooLarge { len: usize, max: usize },
    /// `tokenizer.chat_template` is not a string (model file's fault).
    #[error("chat template metadata: {0}")]
    Metadata(#[from] GgufError),
    /// The model's template does not parse (model file's fault).
    #[error("chat template does not compile: {0}")]
    Syntax(String),
    /// The template called `raise_exception`, rejecting these messages
    /// (the caller's fault, e.g. roles that do not alternate).
    #[error("chat template rejected the messages: {0}")]
    Rejected(String),
    /// Rendering failed inside the template (model file's fault), fuel and
    /// output limits included.
    #[error("chat template failed to render: {0}")]
    Render(String),
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

/// A message as the template sees it: a dict with keys `role`, `content`.
#[derive(Debug)]
struct MessageObject(ChatMessage);

impl Object for MessageObject {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        match key.as_str()? {
            "role" => Some(Value::from(self.0.role.as_str())),
            "content" => Some(Value::from(self.0.content.as_str())),
            _ => None,
        }
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Str(&["role", "content"])
    }
}

/// The error `raise_exception` attaches so we can tell it from template bugs.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Raised(String);

impl ChatTemplate {
    /// Compiles `source` (ChatML when `None`) with the model's BOS/EOS texts.
    pub fn new(
        source: Option<&str>,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<Self, ChatTemplateError> {
        let source = source.unwrap_or(CHATML_TEMPLATE);
        if source.len() > MAX_TEMPLATE_BYTES {
            return Err(ChatTemplateError::TooLarge {
                len: source.len(),
                max: MAX_TEMPLATE_BYTES,
            });
        }
        let mut env = Environment::new();
        // transformers' ImmutableSandboxedEnvironment(trim_blocks=True,
        // lstrip_blocks=True); keep_trailing_newline stays jinja2's False.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_fuel(Some(RENDER_FUEL));
        env.set_recursion_limit(MAX_TEMPLATE_RECURSION);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source.to_owned())
            .map_err(|e| ChatTemplateError::Syntax(describe(&e)))?;
        Ok(Self {
            env,
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
        })
    }

    /// The model's own template (`tokenizer.chat_template`; ChatML when
    /// absent) with the BOS/EOS texts of its tokenizer.
    pub fn from_metadata(md: &Metadata, tokenizer: &Tokenizer) -> Result<Self, ChatTemplateError> {
        let source = md.get_str("tokenizer.chat_template")?;
        let text = |id: Option<u32>| id.and_then(|id| tokenizer.token_text(id)).unwrap_or("");
        Self::new(source, text(tokenizer.bos_id()), text(tokenizer.eos_id()))
    }

    /// Renders the conversation; `add_generation_prompt` appends the
    /// assistant header so the model answers next.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        self.render_messages(messages.to_vec(), add_generation_prompt)
    }

    /// Renders the conversation for [`Tokenizer::encode_marked`]: each
    /// message's content (less the whitespace at its ends, which templates
    /// often `trim`) is enclosed in literal marks, so a control token's
    /// spelling written in a message stays text and only the template's
    /// own control tokens steer the model. The marks are taken out of the
    /// content first (they are Unicode noncharacters). Otherwise the same
    /// text as [`ChatTemplate::render`].
    pub fn render_marked(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        let marked = messages
            .iter()
            .map(|m| ChatMessage {
                role: m.role.clone(),
                content: mark_literal(&m.content),
            })
            .collect();
        self.render_messages(marked, add_generation_prompt)
    }

    fn render_messages(
        &self,
        messages: Vec<ChatMessage>,
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ChatTemplateError::Syntax(describe(&e)))?;
        // Messages go in as objects so that iteration and `tojson` see the
        // keys in Python's order (role, content), not sorted.
        let messages: Vec<Value> = messages
            .into_iter()
            .map(|m| Value::from_object(MessageObject(m)))
            .collect();
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        };
        let mut out = CappedWriter { buf: Vec::new() };
        template
            .render_captured_to(ctx, &mut out)
            .map_err(|e| match raised_message(&e) {
                Some(msg) => ChatTemplateError::Rejected(msg),
                None => ChatTemplateError::Render(describe(&e)),
            })?;
        String::from_utf8(out.buf)
            .map_err(|_| ChatTemplateError::Render("output is not UTF-8".to_owned()))
    }
}

/// `content` with its whitespace-trimmed core between literal marks (none
/// around empty or all-whitespace content); marks already in it dropped.
fn mark_literal(content: &str) -> String {
    let content: String = content
        .chars()
        .filter(|&c| c != LITERAL_START && c != LITERAL_END)
        .collect();
    let core = content.trim();
    if core.is_empty() {
        return content;
    }
    let start = content.len() - content.trim_start().len();
    let end = start + core.len();
    let mut marked = String::with_capacity(content.len() + 6);
    marked.push_str(&content[..start]);
    marked.push(LITERAL_START);
    marked.push_str(core);
    marked.push(LITERAL_END);
    marked.push_str(&content[end..]);
    marked
}

/// The message of a `raise_exception` call somewhere in the error chain.
fn raised_message(e: &Error) -> Option<String> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(raised) = err.downcast_ref::<Raised>() {
            return Some(raised.0.clone());
        }
        source = err.source();
    }
    None
}

/// The error with its template line, without minijinja's multi-line dump.
fn describe(e: &Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(err) = source {
        text.push_str(": ");
        text.push_str(&err.to_string());
        source = err.source();
    }
    text
}

/// An `io::Write` that refuses to grow past [`MAX_RENDERED_BYTES`].
struct CappedWriter {
    buf: Vec<u8>,
}

impl io::Write for CappedWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len() + data.len() > MAX_RENDERED_BYTES {
            return Err(io::Error::other(format!(
                "rendered output exceeds {MAX_RENDERED_BYTES} bytes"
            )));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(Raised(message)))
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=indent)` as
/// transformers registers it: no HTML escaping, `", "` / `": "` separators,
/// keys in insertion order.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    let style = JsonStyle {
        indent,
        sort_keys: sort_keys.unwrap_or(false),
    };
    write_python_json(&value, style, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

/// Deepest nesting `tojson` follows; guards the recursion.
const MAX_JSON_DEPTH: usize = 128;

#[derive(Clone, Copy)]
struct JsonStyle {
    indent: Option<usize>,
    sort_keys: bool,
}

fn write_python_json(
    v: &Value,
    style: JsonStyle,
    depth: usize,
    out: &mut String,
) -> Result<(), Error> {
    if depth > MAX_JSON_DEPTH {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson: value nested too deeply",
        ));
    }
    let newline = |out: &mut String, depth: usize| {
        if let Some(width) = style.indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', width * depth));
        }
    };
    // json.dumps separates items with ", " unless indenting (then ",").
    let item_sep = if style.indent.is_some() { "," } else { ", " };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&v.to_string()),
        ValueKind::String => {
            out.push_str(&serde_json::Value::from(v.as_str().unwrap_or_default()).to_string())
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_python_json(item, style, depth + 1, out)?;
            }
            newline(out, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if style.sort_keys {
                keys.sort();
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                let key_text = key.as_str().map_or_else(|| key.to_string(), str::to_owned);
                out.push_str(&serde_json::Value::from(key_text).to_string());
                out.push_str(": ");
                write_python_json(&v.get_item(key)?, style, depth + 1, out)?;
            }
            newline(out, depth);
            out.push('}');
        }
        other => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: cannot serialize a value of kind {other}"),
            ));
        }
    }
    Ok(())
}

/// `strftime_now(format)` as transformers provides it, in UTC. Supports the
/// directives templates use: `%d %m %Y %y %b %B %a %A %H %M %S %j %%`.
fn strftime_now(format: String) -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format_utc(secs, &format)
}

fn format_utc(secs: u64, format: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (year, month, day) = civil_from_days(days as i64);
    let weekday = ((days + 3) % 7) as usize; // 1970-01-01 was a Thursday
    let is_leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let cumulative = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cumulative[month - 1] + day + usize::from(is_leap && month > 2);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year % 100)),
            Some('b') => out.push_str(&MONTHS[month - 1][..3]),
            Some('B') => out.push_str(MONTHS[month - 1]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('H') => out.push_str(&format!("{:02}", rem / 3600)),
            Some('M') => out.push_str(&format!("{:02}", rem / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", rem % 60)),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 → (year, month 1..=12, day 1..=31); Howard Hinnant's algorithm.
fn civil_from_days(days: i64) -> (i64, usize, usize) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as usize;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as usize;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.to_owned(),
            content: content.to_owned(),
        }
    }

    #[test]
    fn chatml_fallback() {
        let t = ChatTemplate::new(None, "<s>", "</s>").unwrap();
        let out = t
            .render(&[msg("system", "Be brief."), msg("user", "Hi")], true)
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        let out = t.render(&[msg("user", "Hi")], false).unwrap();
        assert_eq!(out, "<|im_start|>user\nHi<|im_end|>\n");
    }

    #[test]
    fn trim_and_lstrip_blocks_and_python_methods() {
        let src = "{{ bos_token }}\n  {% for m in messages %}\n    [{{ m.role.upper() }}] {{ m.content.strip() | trim }}\n  {% endfor %}\n{% if add_generation_prompt %}[A]{% endif %}\n";
        let t = ChatTemplate::new(Some(src), "<s>", "</s>").unwrap();
        let out = t
            .render(&[msg("user", "  hi  "), msg("assistant", "yo")], true)
            .unwrap();
        assert_eq!(out, "<s>\n    [USER] hi\n    [ASSISTANT] yo\n[A]");
    }

    #[test]
    fn loop_controls_and_namespace() {
        let src = "{% set ns = namespace(n=0) %}{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{% set ns.n = ns.n + 1 %}{{ m.content }}{% endfor %}{{ ns.n }}";
        let t = ChatTemplate::new(Some(src), "", "").unwrap();
        assert_eq!(
            t.render(&[msg("u", "a"), msg("u", "b"), msg("u", "c")], false)
                .unwrap(),
            "ab2"
        );
    }

    #[test]
    fn raise_exception_is_a_rejection() {
        let src = "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}ok";
        let t = ChatTemplate::new(Some(src), "", "").unwrap();
        match t.render(&[msg("assistant", "x")], false) {
            Err(ChatTemplateError::Rejected(m)) => {
                assert_eq!(m, "Conversation must start with user")
            }
            other => panic!("expected rejection, got {other:?}"),
        }
        assert_eq!(t.render(&[msg("user", "x")], false).unwrap(), "ok");
    }

    #[test]
    fn syntax_errors_name_the_problem() {
        let err = ChatTemplate::new(Some("{% for m in messages %}"), "", "").unwrap_err();
        assert!(matches!(err, ChatTemplateError::Syntax(_)), "{err}");
        let err = ChatTemplate::new(Some(&"x".repeat(MAX_TEMPLATE_BYTES + 1)), "", "").unwrap_err();
        assert!(matches!(err, ChatTemplateError::TooLarge { .. }));
    }

    #[test]
    fn hostile_templates_hit_limits() {
        let spin =
            "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}";
        let err = ChatTemplate::new(Some(spin), "", "")
            .unwrap()
            .render(&[], false)
            .unwrap_err();
        assert!(matches!(err, ChatTemplateError::Render(_)), "{err}");
        let big = "{% for a in range(100000) %}{{ messages[0].content }}{% endfor %}";
        let long = msg("user", &"x".repeat(1000));
        let err = ChatTemplate::new(Some(big), "", "")
            .unwrap()
            .render(&[long], false)
            .unwrap_err();
        assert!(err.to_string().contains("exceeds"), "{err}");
        let recurse = "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}";
        let err = ChatTemplate::new(Some(recurse), "", "")
            .unwrap()
            .render(&[], false)
            .unwrap_err();
        assert!(matches!(err, ChatTemplateError::Render(_)), "{err}");
    }

    #[test]
    fn tojson_is_python_json_dumps() {
        let t = ChatTemplate::new(
            Some("{{ messages[0] | tojson }}|{{ [1, 'é<', none] | tojson(indent=2) }}"),
            "",
            "",
        )
        .unwrap();
        assert_eq!(
            t.render(&[msg("user", "a\"b")], false).unwrap(),
            "{\"role\": \"user\", \"content\": \"a\\\"b\"}|[\n  1,\n  \"é<\",\n  null\n]"
        );
    }

    #[test]
    fn utc_formatting() {
        // 2024-07-26 13:05:09 UTC, a Friday.
        let secs = 1_722_000_000 - 1_722_000_000 % 86_400 + 13 * 3600 + 5 * 60 + 9;
        assert_eq!(
            format_utc(secs, "%d %b %Y %H:%M:%S %A %j %%"),
            "26 Jul 2024 13:05:09 Friday 208 %"
        );
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
    }
}
