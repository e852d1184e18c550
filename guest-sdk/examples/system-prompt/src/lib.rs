//! Puts the tenant's system prompt in front of every request.
//!
//! Config (the plugin's table in the tenant policy):
//!
//! - `prompt`: the system prompt. Unset or empty: requests pass unchanged
//!   (and a warning is logged).
//! - `text_prompts`: what to do with `/v1/completions` text prompts:
//!   `"prefix"` (default) puts the prompt and a blank line before the text;
//!   `"leave"` passes them unchanged.
//!
//! Chat requests get a `system` message first. When the conversation
//! already starts with a system message, the prompt is put in front of that
//! message's content (separated by a blank line) instead of adding a second
//! one, because many chat templates accept only one system message, and only
//! first. Token-id prompts cannot be rewritten without the model's tokenizer
//! and pass unchanged.

use bulkhead_guest::{Message, Plugin, Prompt, Rejection, Request, config, export_plugin, log};

/// Between the tenant's prompt and what follows it.
const SEPARATOR: &str = "\n\n";

/// What to do with text (non-chat) prompts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TextPrompts {
    /// Put the system prompt and a blank line before the text.
    Prefix,
    /// Leave text prompts unchanged.
    Leave,
}

impl TextPrompts {
    /// Reads the `text_prompts` setting; `None` when it is not a known value.
    pub fn parse(value: &str) -> Option<Self> {
        match value.trim() {
            "prefix" => Some(Self::Prefix),
            "leave" => Some(Self::Leave),
            _ => None,
        }
    }
}

/// Adds `system_prompt` to `prompt` (see the crate docs for the rules).
pub fn apply(prompt: &mut Prompt, system_prompt: &str, text_prompts: TextPrompts) {
    match prompt {
        Prompt::Chat(messages) => match messages.first_mut() {
            Some(first) if first.role == "system" => {
                first.content = format!("{system_prompt}{SEPARATOR}{}", first.content);
            }
            _ => messages.insert(0, Message::system(system_prompt)),
        },
        Prompt::Text(text) => {
            if text_prompts == TextPrompts::Prefix {
                *text = format!("{system_prompt}{SEPARATOR}{text}");
            }
        }
        Prompt::Tokens(_) => {}
    }
}

/// The plugin.
#[derive(Debug, Default)]
pub struct SystemPrompt;

impl Plugin for SystemPrompt {
    fn on_request(&mut self, mut req: Request) -> Result<Request, Rejection> {
        let Some(system_prompt) = config("prompt").filter(|p| !p.is_empty()) else {
            log::warn("no `prompt` configured; request passes unchanged");
            return Ok(req);
        };
        let setting = config("text_prompts");
        let text_prompts = match setting.as_deref().map(TextPrompts::parse) {
            None => TextPrompts::Prefix,
            Some(Some(known)) => known,
            Some(None) => {
                log::warn("`text_prompts` must be \"prefix\" or \"leave\"; using \"prefix\"");
                TextPrompts::Prefix
            }
        };
        if matches!(req.prompt, Prompt::Tokens(_)) {
            log::debug("token-id prompt passes unchanged");
        }
        apply(&mut req.prompt, &system_prompt, text_prompts);
        Ok(req)
    }
}

export_plugin!(SystemPrompt);

#[cfg(test)]
mod tests {
    use super::*;
    use bulkhead_guest::testing;

    fn chat(messages: Vec<Message>) -> Prompt {
        Prompt::Chat(messages)
    }

    #[test]
    fn chat_gets_a_system_message_first() {
        let mut prompt = chat(vec![Message::user("hi")]);
        apply(&mut prompt, "Be brief.", TextPrompts::Prefix);
        assert_eq!(
            prompt,
            chat(vec![Message::system("Be brief."), Message::user("hi")])
        );
    }

    #[test]
    fn an_existing_system_message_is_extended_not_duplicated() {
        let mut prompt = chat(vec![
            Message::system("You are a pirate."),
            Message::user("hi"),
        ]);
        apply(&mut prompt, "Be brief.", TextPrompts::Prefix);
        assert_eq!(
            prompt,
            chat(vec![
                Message::system("Be brief.\n\nYou are a pirate."),
                Message::user("hi"),
            ])
        );
    }

    #[test]
    fn a_system_message_later_on_does_not_count() {
        let mut prompt = chat(vec![Message::user("hi"), Message::system("late")]);
        apply(&mut prompt, "Be brief.", TextPrompts::Prefix);
        assert_eq!(prompt.texts(), ["Be brief.", "hi", "late"]);
    }

    #[test]
    fn empty_chat_gets_the_system_message() {
        let mut prompt = chat(vec![]);
        apply(&mut prompt, "Be brief.", TextPrompts::Prefix);
        assert_eq!(prompt, chat(vec![Message::system("Be brief.")]));
    }

    #[test]
    fn text_prompts_are_prefixed_or_left() {
        let mut prompt = Prompt::Text("Once upon".into());
        apply(&mut prompt, "Be brief.", TextPrompts::Prefix);
        assert_eq!(prompt, Prompt::Text("Be brief.\n\nOnce upon".into()));

        let mut prompt = Prompt::Text("Once upon".into());
        apply(&mut prompt, "Be brief.", TextPrompts::Leave);
        assert_eq!(prompt, Prompt::Text("Once upon".into()));
    }

    #[test]
    fn token_prompts_pass_unchanged() {
        let mut prompt = Prompt::Tokens(vec![1, 2, 3]);
        apply(&mut prompt, "Be brief.", TextPrompts::Prefix);
        assert_eq!(prompt, Prompt::Tokens(vec![1, 2, 3]));
    }

    #[test]
    fn hook_reads_config() {
        testing::set_config([("prompt", "Be brief."), ("text_prompts", "leave")]);
        let req = Request::new("m", Prompt::Text("x".into()));
        let out = SystemPrompt.on_request(req.clone()).unwrap();
        assert_eq!(out, req);

        let req = Request::new("m", chat(vec![Message::user("hi")]));
        let out = SystemPrompt.on_request(req).unwrap();
        assert_eq!(out.prompt.texts(), ["Be brief.", "hi"]);
    }

    #[test]
    fn hook_without_prompt_passes_and_warns() {
        testing::set_config::<&str, &str>([]);
        let req = Request::new("m", chat(vec![Message::user("hi")]));
        assert_eq!(SystemPrompt.on_request(req.clone()), Ok(req));
        let logs = testing::take_logs();
        assert_eq!(logs.len(), 1);
        assert_eq!(logs[0].0, log::Level::Warn);
    }

    #[test]
    fn text_prompts_setting() {
        assert_eq!(TextPrompts::parse(" leave "), Some(TextPrompts::Leave));
        assert_eq!(TextPrompts::parse("prefix"), Some(TextPrompts::Prefix));
        assert_eq!(TextPrompts::parse("append"), None);
    }
}
