//! A tenant's `[plugins]` table: the hook chains, and each chained
//! plugin's config and limits, checked against the limits the plugin host
//! can enforce.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use toml::Spanned;

use super::files::{PluginLimitsFile, TenantPluginsFile};
use super::{PluginSettings, PolicyError, SourceFile, TenantPlugins};
use crate::plugins::{
    MAX_MEMORY_BYTES_CEILING, MAX_TABLE_ELEMENTS_CEILING, PLUGIN_NAME_RULE, PluginConfig,
    PluginLimits, PluginName,
};

/// Plugins in one chain. Each one adds an instance per request and a hop
/// per hook; eight covers a guard, a rewriter and a redactor with room to
/// spare while bounding what one request can cost.
pub const MAX_CHAIN_PLUGINS: usize = 8;

/// Longest deadline a policy may give one hook call. A hook rewrites text;
/// a second of CPU per call is already far past any real plugin and holds a
/// blocking thread that long.
pub const MAX_PLUGIN_DEADLINE: Duration = Duration::from_secs(1);

/// Largest `max_output_bytes` a policy may set: four times the largest
/// request body the default limits allow, well under the memory ceiling.
pub const MAX_PLUGIN_OUTPUT_BYTES: u64 = 16 << 20;

/// Largest `max_log_bytes` a policy may set: a plugin that needs more log
/// than this per request is flooding the gateway's log.
pub const MAX_PLUGIN_LOG_BYTES: u64 = 1 << 20;

/// Config entries per plugin, and their sizes: config is a handful of
/// settings, copied into every instance that asks for it.
pub const MAX_CONFIG_ENTRIES: usize = 256;
pub const MAX_CONFIG_KEY_BYTES: usize = 256;
pub const MAX_CONFIG_VALUE_BYTES: usize = 64 << 10;

/// The most the plugin host lets any policy grant: what `[plugins.maximums]`
/// in `gateway.toml` defaults to and may not exceed.
pub(crate) fn ceilings() -> PluginLimits {
    PluginLimits {
        max_memory_bytes: MAX_MEMORY_BYTES_CEILING,
        max_table_elements: MAX_TABLE_ELEMENTS_CEILING,
        deadline: MAX_PLUGIN_DEADLINE,
        max_output_bytes: MAX_PLUGIN_OUTPUT_BYTES as usize,
        max_log_bytes: MAX_PLUGIN_LOG_BYTES as usize,
    }
}

/// `[plugins.maximums]` in `gateway.toml`, each within the host's ceilings.
pub(super) fn check_maximums(
    source: &SourceFile,
    file: &PluginLimitsFile,
    errors: &mut Vec<PolicyError>,
) -> PluginLimits {
    let ceilings = ceilings();
    check_limits(
        source,
        file,
        &ceilings,
        &ceilings,
        "the plugin host's ceiling",
        errors,
    )
}

/// Checks `[plugins]` and resolves every chained plugin's settings; limits
/// may not exceed the gateway's `maximums`, and unset ones are the defaults
/// clamped to them.
pub(super) fn check(
    dir: &Path,
    source: &SourceFile,
    file: &TenantPluginsFile,
    maximums: &PluginLimits,
    errors: &mut Vec<PolicyError>,
) -> TenantPlugins {
    let signing_keys = file
        .signing_keys
        .iter()
        .filter_map(|path| {
            read_signing_key(&dir.join(path.get_ref()))
                .map_err(|reason| {
                    errors.push(source.error_at(
                        path.span(),
                        format!("signing key {}: {reason}", path.get_ref().display()),
                    ));
                })
                .ok()
        })
        .collect();
    let defaults = clamp(&PluginLimits::default(), maximums);
    let on_request = check_chain(source, "on_request", &file.on_request, errors);
    let on_response = check_chain(source, "on_response", &file.on_response, errors);
    let chained: BTreeSet<&Arc<str>> = on_request.iter().chain(&on_response).collect();

    for (name, table) in &file.config {
        if !chained.iter().any(|c| ***c == **name) {
            errors.push(source.error_at(table.span(), unchained("config", name)));
        }
    }
    for (name, table) in &file.limits {
        if !chained.iter().any(|c| ***c == **name) {
            errors.push(source.error_at(table.span(), unchained("limits", name)));
        }
    }

    let settings = chained
        .into_iter()
        .map(|name| {
            let config = file
                .config
                .get(&**name)
                .map(|table| check_config(source, name, table, errors))
                .unwrap_or_default();
            let limits = file.limits.get(&**name).map_or_else(
                || defaults.clone(),
                |table| {
                    let maximum = "gateway.toml's [plugins.maximums]";
                    check_limits(
                        source,
                        table.get_ref(),
                        &defaults,
                        maximums,
                        maximum,
                        errors,
                    )
                },
            );
            let settings = PluginSettings {
                config: Arc::new(config),
                limits,
            };
            (Arc::clone(name), settings)
        })
        .collect();
    let changes_per_min = file.changes_per_min.as_ref().map(|n| {
        let value = *n.get_ref();
        if !(1..=MAX_PLUGIN_CHANGES_PER_MIN).contains(&value) {
            errors.push(source.error_at(
                n.span(),
                format!(
                    "`changes_per_min` is {value}; it must be from 1 to \
                     {MAX_PLUGIN_CHANGES_PER_MIN} (every change is compiled and audited)"
                ),
            ));
        }
        value
    });
    TenantPlugins {
        on_request,
        on_response,
        settings,
        signing_keys,
        changes_per_min,
    }
}

/// Most plugin uploads and deletes per minute a tenant may be allowed.
pub const MAX_PLUGIN_CHANGES_PER_MIN: u32 = 1000;

/// A key file is a few hundred bytes; anything bigger is the wrong file.
const MAX_KEY_FILE_BYTES: u64 = 16 << 10;

/// An Ed25519 public key from an SPKI PEM file (`openssl pkey -pubout`,
/// `bulkhead token keygen`'s `.pub.pem`).
fn read_signing_key(path: &Path) -> Result<ed25519_dalek::VerifyingKey, String> {
    use ed25519_dalek::pkcs8::DecodePublicKey;
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if !meta.is_file() || meta.len() > MAX_KEY_FILE_BYTES {
        return Err(format!(
            "must be a PEM file of at most {MAX_KEY_FILE_BYTES} bytes"
        ));
    }
    let pem = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    ed25519_dalek::VerifyingKey::from_public_key_pem(&pem)
        .map_err(|e| format!("not an Ed25519 public key in SPKI PEM ({e})"))
}

fn unchained(table: &str, name: &str) -> String {
    format!(
        "`[plugins.{table}.{name}]` is for plugin `{name}`, which is in neither \
         `on_request` nor `on_response`"
    )
}

fn check_chain(
    source: &SourceFile,
    key: &str,
    names: &[Spanned<String>],
    errors: &mut Vec<PolicyError>,
) -> Vec<Arc<str>> {
    if names.len() > MAX_CHAIN_PLUGINS {
        errors.push(source.error_at(
            names[MAX_CHAIN_PLUGINS].span(),
            format!(
                "`{key}` lists {} plugins; a chain holds at most {MAX_CHAIN_PLUGINS}",
                names.len()
            ),
        ));
    }
    let mut chain: Vec<Arc<str>> = Vec::with_capacity(names.len());
    for name in names {
        let text = name.get_ref();
        if PluginName::parse(text).is_err() {
            errors.push(source.error_at(
                name.span(),
                format!("plugin name `{text}` in `{key}` is not valid: {PLUGIN_NAME_RULE}"),
            ));
        } else if chain.iter().any(|c| **c == **text) {
            errors.push(source.error_at(
                name.span(),
                format!("plugin `{text}` is listed twice in `{key}`"),
            ));
        } else {
            chain.push(Arc::from(text.as_str()));
        }
    }
    chain
}

fn check_config(
    source: &SourceFile,
    plugin: &str,
    table: &Spanned<BTreeMap<String, Spanned<toml::Value>>>,
    errors: &mut Vec<PolicyError>,
) -> PluginConfig {
    let entries = table.get_ref();
    if entries.len() > MAX_CONFIG_ENTRIES {
        errors.push(source.error_at(
            table.span(),
            format!(
                "plugin `{plugin}` has {} config entries; at most {MAX_CONFIG_ENTRIES}",
                entries.len()
            ),
        ));
    }
    let mut config = PluginConfig::new();
    for (key, value) in entries {
        let text = match value.get_ref() {
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            toml::Value::Datetime(d) => d.to_string(),
            toml::Value::Array(_) | toml::Value::Table(_) => {
                errors.push(source.error_at(
                    value.span(),
                    format!(
                        "config `{key}` of plugin `{plugin}` must be a string, number or \
                         boolean (plugins read config as text)"
                    ),
                ));
                continue;
            }
        };
        if key.len() > MAX_CONFIG_KEY_BYTES {
            errors.push(source.error_at(
                value.span(),
                format!(
                    "a config key of plugin `{plugin}` is {} bytes; at most {MAX_CONFIG_KEY_BYTES}",
                    key.len()
                ),
            ));
        }
        if text.len() > MAX_CONFIG_VALUE_BYTES {
            errors.push(source.error_at(
                value.span(),
                format!(
                    "config `{key}` of plugin `{plugin}` is {} bytes; at most \
                     {MAX_CONFIG_VALUE_BYTES}",
                    text.len()
                ),
            ));
        }
        config.insert(key.clone(), text);
    }
    config
}

/// Each limit in `1..=` its maximum (`what` names where the maximum comes
/// from); unset ones are `defaults`'.
fn check_limits(
    source: &SourceFile,
    file: &PluginLimitsFile,
    defaults: &PluginLimits,
    maximums: &PluginLimits,
    what: &str,
    errors: &mut Vec<PolicyError>,
) -> PluginLimits {
    let mut limits = defaults.clone();
    let mut check = |key: &str, value: &Option<Spanned<u64>>, max: u64| {
        let value = value.as_ref()?;
        let n = *value.get_ref();
        if (1..=max).contains(&n) {
            Some(n)
        } else {
            errors.push(source.error_at(
                value.span(),
                format!("`{key}` is {n}; it must be between 1 and {max} ({what})"),
            ));
            None
        }
    };
    if let Some(ms) = check(
        "deadline_ms",
        &file.deadline_ms,
        maximums.deadline.as_millis() as u64,
    ) {
        limits.deadline = Duration::from_millis(ms);
    }
    if let Some(mib) = check(
        "max_memory_mib",
        &file.max_memory_mib,
        (maximums.max_memory_bytes >> 20) as u64,
    ) {
        limits.max_memory_bytes = (mib as usize) << 20;
    }
    if let Some(n) = check(
        "max_output_bytes",
        &file.max_output_bytes,
        maximums.max_output_bytes as u64,
    ) {
        limits.max_output_bytes = n as usize;
    }
    if let Some(n) = check(
        "max_log_bytes",
        &file.max_log_bytes,
        maximums.max_log_bytes as u64,
    ) {
        limits.max_log_bytes = n as usize;
    }
    if let Some(n) = check(
        "max_table_elements",
        &file.max_table_elements,
        maximums.max_table_elements as u64,
    ) {
        limits.max_table_elements = n as usize;
    }
    limits
}

/// `limits` with each field at most `maximums`'.
fn clamp(limits: &PluginLimits, maximums: &PluginLimits) -> PluginLimits {
    PluginLimits {
        max_memory_bytes: limits.max_memory_bytes.min(maximums.max_memory_bytes),
        max_table_elements: limits.max_table_elements.min(maximums.max_table_elements),
        deadline: limits.deadline.min(maximums.deadline),
        max_output_bytes: limits.max_output_bytes.min(maximums.max_output_bytes),
        max_log_bytes: limits.max_log_bytes.min(maximums.max_log_bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::files::TenantFile;

    fn check_text(plugins: &str) -> (TenantPlugins, Vec<String>) {
        let text = format!(
            "id = \"t\"\n[jwt]\nissuer = \"i\"\naudience = [\"a\"]\nalgorithms = [\"EdDSA\"]\n{plugins}"
        );
        let source = SourceFile::new("tenants/t.toml", text.clone());
        let doc: TenantFile = toml::from_str(&text).expect("parses");
        let mut errors = Vec::new();
        let plugins = check(
            Path::new("."),
            &source,
            &doc.plugins,
            &ceilings(),
            &mut errors,
        );
        (plugins, errors.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn chains_config_and_limits_resolve() {
        let (plugins, errors) = check_text(
            "[plugins]\non_request = [\"system-prompt\", \"pii-redact\"]\n\
             on_response = [\"pii-redact\"]\n\
             [plugins.config.system-prompt]\nprompt = \"Be brief.\"\nrepeat = 2\nloud = false\n\
             [plugins.limits.pii-redact]\ndeadline_ms = 20\nmax_memory_mib = 32\n",
        );
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            plugins.on_request,
            vec![Arc::from("system-prompt"), Arc::from("pii-redact")]
        );
        assert_eq!(plugins.on_response, vec![Arc::from("pii-redact")]);
        assert_eq!(plugins.settings.len(), 2);
        let prompt = &plugins.settings["system-prompt"];
        assert_eq!(prompt.config["prompt"], "Be brief.");
        assert_eq!(prompt.config["repeat"], "2");
        assert_eq!(prompt.config["loud"], "false");
        assert_eq!(prompt.limits, PluginLimits::default());
        let pii = &plugins.settings["pii-redact"];
        assert!(pii.config.is_empty());
        assert_eq!(pii.limits.deadline, Duration::from_millis(20));
        assert_eq!(pii.limits.max_memory_bytes, 32 << 20);
        assert_eq!(
            pii.limits.max_output_bytes,
            PluginLimits::default().max_output_bytes
        );
    }

    #[test]
    fn no_plugins_table_means_no_chain() {
        let (plugins, errors) = check_text("");
        assert!(errors.is_empty());
        assert!(plugins.is_empty());
        assert!(plugins.settings.is_empty());
    }

    #[test]
    fn every_mistake_is_named_with_its_place() {
        let (_, errors) = check_text(
            "[plugins]\non_request = [\"a\", \"a\", \"Bad_Name\"]\n\
             [plugins.config.ghost]\nx = \"1\"\n\
             [plugins.config.a]\nlist = [1, 2]\n\
             [plugins.limits.a]\ndeadline_ms = 0\nmax_memory_mib = 100000\n",
        );
        let all = errors.join("\n");
        for expected in [
            "tenants/t.toml:7:20: plugin `a` is listed twice in `on_request`",
            "plugin name `Bad_Name` in `on_request` is not valid",
            "`[plugins.config.ghost]` is for plugin `ghost`, which is in neither",
            "config `list` of plugin `a` must be a string, number or boolean",
            "`deadline_ms` is 0; it must be between 1 and 1000",
            "`max_memory_mib` is 100000; it must be between 1 and 256",
        ] {
            assert!(all.contains(expected), "missing {expected:?} in:\n{all}");
        }
        assert_eq!(errors.len(), 6, "{all}");
    }

    #[test]
    fn signing_keys_are_read_and_bad_ones_named() {
        let text = "id = \"t\"\n[jwt]\nissuer = \"i\"\naudience = [\"a\"]\nalgorithms = [\"EdDSA\"]\n\
                    [plugins]\nsigning_keys = [\"dev-keys/demo.pub.pem\", \"dev-keys/demo.key.pem\", \"nope.pem\"]\n";
        let source = SourceFile::new("tenants/t.toml", text);
        let doc: TenantFile = toml::from_str(text).expect("parses");
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
        let mut errors = Vec::new();
        let plugins = check(&dir, &source, &doc.plugins, &ceilings(), &mut errors);
        assert_eq!(plugins.signing_keys.len(), 1);
        let all: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(all.len(), 2, "{all:?}");
        assert!(
            all[0].contains("signing key dev-keys/demo.key.pem: not an Ed25519 public key"),
            "{all:?}"
        );
        assert!(all[1].contains("signing key nope.pem: "), "{all:?}");
    }

    #[test]
    fn chains_are_bounded() {
        let names: Vec<String> = (0..=MAX_CHAIN_PLUGINS)
            .map(|i| format!("\"p{i}\""))
            .collect();
        let (_, errors) = check_text(&format!(
            "[plugins]\non_response = [{}]\n",
            names.join(", ")
        ));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].contains("a chain holds at most 8"), "{errors:?}");
    }

    #[test]
    fn unknown_keys_are_refused() {
        let text = "id = \"t\"\n[jwt]\nissuer = \"i\"\naudience = [\"a\"]\nalgorithms = [\"EdDSA\"]\n\
                    [plugins]\non_requests = [\"a\"]\n";
        let err = toml::from_str::<TenantFile>(text).unwrap_err().to_string();
        assert!(err.contains("on_requests"), "{err}");
        let text = "id = \"t\"\n[jwt]\nissuer = \"i\"\naudience = [\"a\"]\nalgorithms = [\"EdDSA\"]\n\
                    [plugins]\non_request = [\"a\"]\n[plugins.limits.a]\ndeadline = 5\n";
        let err = toml::from_str::<TenantFile>(text).unwrap_err().to_string();
        assert!(err.contains("deadline"), "{err}");
    }
}

#[cfg(test)]
mod maximum_tests {
    use super::*;
    use crate::policy::files::{GatewayFile, TenantFile};

    #[test]
    fn tenants_stay_within_the_operators_maximums_and_defaults_are_clamped() {
        let gateway_text = "[plugins.maximums]\ndeadline_ms = 20\nmax_memory_mib = 32\n";
        let gateway_source = SourceFile::new("gateway.toml", gateway_text);
        let gateway: GatewayFile = toml::from_str(gateway_text).unwrap();
        let mut errors = Vec::new();
        let maximums = check_maximums(
            &gateway_source,
            gateway.plugins.as_ref().unwrap().maximums.as_ref().unwrap(),
            &mut errors,
        );
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(maximums.deadline, Duration::from_millis(20));
        assert_eq!(maximums.max_output_bytes, MAX_PLUGIN_OUTPUT_BYTES as usize);

        let text = "id = \"t\"\n[jwt]\nissuer = \"i\"\naudience = [\"a\"]\nalgorithms = [\"EdDSA\"]\n\
                    [plugins]\non_request = [\"a\", \"b\"]\n\
                    [plugins.limits.a]\ndeadline_ms = 50\nmax_memory_mib = 16\n";
        let source = SourceFile::new("tenants/t.toml", text);
        let doc: TenantFile = toml::from_str(text).unwrap();
        let plugins = check(
            Path::new("."),
            &source,
            &doc.plugins,
            &maximums,
            &mut errors,
        );
        let all: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(all.len(), 1, "{all:?}");
        assert!(
            all[0].contains("`deadline_ms` is 50; it must be between 1 and 20 (gateway.toml's [plugins.maximums])"),
            "{all:?}"
        );
        // `b` has no limits table: the defaults, clamped.
        let b = &plugins.settings["b"].limits;
        assert_eq!(b.deadline, Duration::from_millis(20));
        assert_eq!(b.max_memory_bytes, 32 << 20);
        assert_eq!(plugins.settings["a"].limits.max_memory_bytes, 16 << 20);

        let over = "[plugins.maximums]\ndeadline_ms = 5000\n";
        let gateway: GatewayFile = toml::from_str(over).unwrap();
        let mut errors = Vec::new();
        check_maximums(
            &SourceFile::new("gateway.toml", over),
            gateway.plugins.as_ref().unwrap().maximums.as_ref().unwrap(),
            &mut errors,
        );
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0]
                .to_string()
                .contains("between 1 and 1000 (the plugin host's ceiling)")
        );
    }
}
