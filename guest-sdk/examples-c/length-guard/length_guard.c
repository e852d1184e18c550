/*
 * length-guard: refuses requests whose prompt is too long, and can cap how
 * many tokens a request may ask the model for. A Bulkhead plugin in C.
 *
 * Config (the plugin's table in the tenant policy; values are strings):
 *
 * - `max_chars`: the longest prompt accepted, in Unicode characters (code
 *   points, not bytes): the text prompt, or the contents of all chat
 *   messages together, whatever their role. A whole number from 1 to
 *   4294967295. Default: 8000.
 * - `status`: the HTTP status the client gets for a prompt over the limit,
 *   400 to 499. Default: 413 (Content Too Large).
 * - `message`: what the client is told. Default: "The prompt is too long:
 *   N characters; the limit is M." The counts also go to the gateway log.
 * - `max_tokens`: when set, a request asking for more completion tokens
 *   than this, or not saying how many, gets `sampling.max-tokens` lowered to
 *   it. A whole number from 1 to 4294967295. Unset: left as the client sent
 *   it.
 *
 * Token-id prompts (`/v1/completions` with token ids) have no characters to
 * count and pass unchecked; `max_tokens` still applies to them. Responses
 * and streamed chunks pass through unchanged.
 *
 * A config it cannot use (`max_chars = "8k"`, `status = "500"`, or an
 * unknown key such as a misspelt `max_char`) is the operator's mistake, not
 * the client's: the plugin logs an error naming the key and the value and
 * traps, so every request through it fails with the gateway's plugin error
 * (`plugin_trap`), naming the plugin. It fails closed: a guard that is
 * misconfigured never lets prompts through unchecked, and never blames the
 * client with a 4xx.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "plugin.h"

#define DEFAULT_MAX_CHARS 8000u
#define DEFAULT_STATUS 413u

/* What this plugin reads from its config table. */
static const char *const KNOWN_KEYS[] = {"max_chars", "max_tokens", "message", "status"};

/* ---- Text: a fixed buffer that cuts what does not fit, at a character
 * boundary (strings crossing into the gateway must be valid UTF-8). ---- */

typedef struct {
    char bytes[512];
    size_t len;
} text_t;

static void text_add(text_t *text, const uint8_t *bytes, size_t len) {
    size_t room = sizeof text->bytes - text->len;
    if (len > room) {
        len = room;
        /* Back off to the start of the character the cut falls in. */
        while (len > 0 && (bytes[len] & 0xC0) == 0x80) {
            len--;
        }
    }
    memcpy(text->bytes + text->len, bytes, len);
    text->len += len;
}

static void text_str(text_t *text, const char *s) {
    text_add(text, (const uint8_t *)s, strlen(s));
}

static void text_u64(text_t *text, uint64_t value) {
    char digits[20];
    size_t n = 0;
    do {
        digits[sizeof digits - ++n] = (char)('0' + value % 10);
        value /= 10;
    } while (value != 0);
    text_add(text, (const uint8_t *)digits + sizeof digits - n, n);
}

/* A borrowed view of the text, for the host's log. */
static plugin_string_t text_view(text_t *text) {
    return (plugin_string_t){(uint8_t *)text->bytes, text->len};
}

/* ---- Host: log and config. ---- */

static void log_text(bulkhead_plugin_host_level_t level, text_t *text) {
    plugin_string_t message = text_view(text);
    bulkhead_plugin_host_log(level, &message);
}

/* The config value for `key`, if set. The caller owns (and frees) it. */
static bool config_value(const char *key, plugin_string_t *value) {
    plugin_string_t name;
    plugin_string_set(&name, key);
    return bulkhead_plugin_host_config(&name, value);
}

static bool same(const plugin_string_t *s, const char *literal) {
    size_t len = strlen(literal);
    return s->len == len && memcmp(s->ptr, literal, len) == 0;
}

/* Logs why the config is unusable and traps (see the top of this file). */
__attribute__((noreturn)) static void config_error(const plugin_string_t *key,
                                                    const plugin_string_t *value,
                                                    const char *expected) {
    text_t text = {.len = 0};
    text_str(&text, "length-guard: config `");
    text_add(&text, key->ptr, key->len);
    text_str(&text, "` = \"");
    text_add(&text, value->ptr, value->len);
    text_str(&text, "\" is not usable: expected ");
    text_str(&text, expected);
    text_str(&text, "; failing the request rather than letting it through unchecked");
    log_text(BULKHEAD_PLUGIN_HOST_LEVEL_ERROR, &text);
    abort();
}

/* Parses a whole number from `min` to `max`: ASCII digits only, no sign,
 * no spaces. */
static bool parse_number(const plugin_string_t *s, uint32_t min, uint32_t max, uint32_t *out) {
    if (s->len == 0) {
        return false;
    }
    uint64_t value = 0;
    for (size_t i = 0; i < s->len; i++) {
        uint8_t c = s->ptr[i];
        if (c < '0' || c > '9') {
            return false;
        }
        value = value * 10 + (c - '0');
        if (value > max) {
            return false;
        }
    }
    if (value < min) {
        return false;
    }
    *out = (uint32_t)value;
    return true;
}

/* Reads the number at `key` into `out`; false when the key is unset. */
static bool config_number(const char *key, uint32_t min, uint32_t max, const char *expected,
                          uint32_t *out) {
    plugin_string_t value;
    if (!config_value(key, &value)) {
        return false;
    }
    if (!parse_number(&value, min, max, out)) {
        plugin_string_t name;
        plugin_string_set(&name, key);
        config_error(&name, &value, expected);
    }
    plugin_string_free(&value);
    return true;
}

/* The numeric settings, read (and checked) once per request. The message is
 * read only when a request is refused. */
typedef struct {
    uint32_t max_chars;
    uint16_t status;
    bool cap_tokens;
    uint32_t max_tokens;
} settings_t;

static settings_t read_settings(void) {
    /* Every key must be one this plugin knows: a misspelt one would
     * otherwise be silently ignored, and the guard would guard less. */
    plugin_list_tuple2_string_string_t entries;
    bulkhead_plugin_host_config_entries(&entries);
    for (size_t i = 0; i < entries.len; i++) {
        bool known = false;
        for (size_t k = 0; k < sizeof KNOWN_KEYS / sizeof KNOWN_KEYS[0]; k++) {
            known = known || same(&entries.ptr[i].f0, KNOWN_KEYS[k]);
        }
        if (!known) {
            config_error(&entries.ptr[i].f0, &entries.ptr[i].f1,
                         "no such key: length-guard reads max_chars, max_tokens, message "
                         "and status");
        }
    }
    plugin_list_tuple2_string_string_free(&entries);

    settings_t settings = {.max_chars = DEFAULT_MAX_CHARS, .status = DEFAULT_STATUS};
    const char *count = "a whole number from 1 to 4294967295";
    config_number("max_chars", 1, UINT32_MAX, count, &settings.max_chars);
    settings.cap_tokens = config_number("max_tokens", 1, UINT32_MAX, count, &settings.max_tokens);
    uint32_t status;
    if (config_number("status", 400, 499, "an HTTP status from 400 to 499", &status)) {
        settings.status = (uint16_t)status;
    }
    return settings;
}

/* ---- The check. ---- */

/* Unicode characters in valid UTF-8: every byte that does not continue a
 * character (continuation bytes are 10xxxxxx) starts one. */
static uint64_t count_chars(const plugin_string_t *s) {
    uint64_t chars = 0;
    for (size_t i = 0; i < s->len; i++) {
        chars += (s->ptr[i] & 0xC0) != 0x80;
    }
    return chars;
}

/* The prompt's length in characters; false for token-id prompts. */
static bool prompt_chars(const bulkhead_plugin_types_prompt_t *prompt, uint64_t *chars) {
    switch (prompt->tag) {
    case BULKHEAD_PLUGIN_TYPES_PROMPT_CHAT:
        *chars = 0;
        for (size_t i = 0; i < prompt->val.chat.len; i++) {
            *chars += count_chars(&prompt->val.chat.ptr[i].content);
        }
        return true;
    case BULKHEAD_PLUGIN_TYPES_PROMPT_TEXT:
        *chars = count_chars(&prompt->val.text);
        return true;
    default:
        return false;
    }
}

/* The refusal of a prompt of `chars` characters. */
static plugin_rejection_t refusal(const settings_t *settings, uint64_t chars) {
    text_t text = {.len = 0};
    text_str(&text, "length-guard: refused a prompt of ");
    text_u64(&text, chars);
    text_str(&text, " characters (max_chars ");
    text_u64(&text, settings->max_chars);
    text_str(&text, ")");
    log_text(BULKHEAD_PLUGIN_HOST_LEVEL_INFO, &text);

    plugin_rejection_t rejection = {.status = settings->status};
    /* A configured message is the host's allocation, now ours: it moves
     * into the rejection, and the bindings free it after the call. */
    if (!config_value("message", &rejection.message)) {
        text.len = 0;
        text_str(&text, "The prompt is too long: ");
        text_u64(&text, chars);
        text_str(&text, " characters; the limit is ");
        text_u64(&text, settings->max_chars);
        text_str(&text, ".");
        plugin_string_dup_n(&rejection.message, text.bytes, text.len);
    }
    return rejection;
}

/* ---- The hooks. Each owns its arguments: it returns them (and the
 * bindings free them once the gateway has read the result) or frees
 * them. ---- */

bool exports_plugin_on_request(plugin_request_t *req, plugin_request_t *ret,
                               plugin_rejection_t *err) {
    settings_t settings = read_settings();

    uint64_t chars;
    if (prompt_chars(&req->prompt, &chars) && chars > settings.max_chars) {
        *err = refusal(&settings, chars);
        plugin_request_free(req);
        return false;
    }

    plugin_option_u32_t *max_tokens = &req->sampling.max_tokens;
    if (settings.cap_tokens && (!max_tokens->is_some || max_tokens->val > settings.max_tokens)) {
        text_t text = {.len = 0};
        text_str(&text, "length-guard: max-tokens ");
        if (max_tokens->is_some) {
            text_u64(&text, max_tokens->val);
        } else {
            text_str(&text, "unset");
        }
        text_str(&text, ", capped to ");
        text_u64(&text, settings.max_tokens);
        log_text(BULKHEAD_PLUGIN_HOST_LEVEL_DEBUG, &text);
        max_tokens->is_some = true;
        max_tokens->val = settings.max_tokens;
    }

    *ret = *req;
    return true;
}

bool exports_plugin_on_response(plugin_response_t *resp, plugin_response_t *ret,
                                plugin_rejection_t *err) {
    (void)err;
    *ret = *resp;
    return true;
}

bool exports_plugin_on_chunk(plugin_string_t *text, plugin_string_t *ret,
                             plugin_rejection_t *err) {
    (void)err;
    *ret = *text;
    return true;
}

bool exports_plugin_on_stream_end(plugin_string_t *ret, plugin_rejection_t *err) {
    (void)err;
    /* Nothing is ever held back. */
    plugin_string_set(ret, "");
    return true;
}
