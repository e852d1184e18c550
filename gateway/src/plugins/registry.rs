//! The uploaded plugins the request path can use, by tenant and name.
//! (Placeholder until the store lands: in memory only.)

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use super::engine::CompiledPlugin;

/// Compiled plugins by (tenant, name). Cheap to clone; lookups never block
/// on I/O or compilation.
#[derive(Clone, Debug, Default)]
pub struct PluginRegistry {
    plugins: Arc<RwLock<HashMap<(String, String), CompiledPlugin>>>,
}

impl PluginRegistry {
    /// Tenant `tenant`'s plugin `name`, if uploaded.
    pub fn get(&self, tenant: &str, name: &str) -> Option<CompiledPlugin> {
        let plugins = self.plugins.read().unwrap_or_else(|e| e.into_inner());
        plugins
            .get(&(tenant.to_string(), name.to_string()))
            .cloned()
    }

    /// Adds or replaces tenant `tenant`'s plugin `name`.
    pub fn insert(&self, tenant: &str, name: &str, plugin: CompiledPlugin) {
        let mut plugins = self.plugins.write().unwrap_or_else(|e| e.into_inner());
        plugins.insert((tenant.to_string(), name.to_string()), plugin);
    }
}
