//! [`Audit`]: the audit log as the gateway's control plane uses it — maybe
//! off (no `[audit]`), and refusing changes up front once it has failed,
//! so at most the one action in flight when a write failed goes unrecorded.

use super::{Actor, AuditError, AuditLog, Event};

/// The gateway's audit log, or none.
#[derive(Clone, Debug, Default)]
pub struct Audit(Option<AuditLog>);

impl Audit {
    /// No audit log: actions are not recorded and the audit API answers 501.
    pub fn disabled() -> Audit {
        Audit(None)
    }

    pub fn new(log: AuditLog) -> Audit {
        Audit(Some(log))
    }

    /// The log, when there is one.
    pub fn log(&self) -> Option<&AuditLog> {
        self.0.as_ref()
    }

    /// Ok when an action may proceed: no log, or a log that still writes
    /// (a shared store is asked: one round trip). Checked before a change,
    /// so a failing log stops changes rather than letting them happen
    /// unrecorded.
    pub async fn ready(&self) -> Result<(), AuditError> {
        let Some(log) = &self.0 else {
            return Ok(());
        };
        if let Some(why) = log.failure() {
            return Err(AuditError::Failed(why));
        }
        if log.is_shared() {
            let log = log.clone();
            tokio::task::spawn_blocking(move || log.sync())
                .await
                .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))?;
        }
        Ok(())
    }

    /// Appends an entry (blocking: fsync); its index, or `None` without a
    /// log.
    pub fn record(&self, actor: Actor, event: Event) -> Result<Option<u64>, AuditError> {
        self.0
            .as_ref()
            .map(|log| log.append(actor, event))
            .transpose()
    }

    /// [`record`](Self::record) on a blocking thread.
    pub async fn record_async(
        &self,
        actor: Actor,
        event: Event,
    ) -> Result<Option<u64>, AuditError> {
        let audit = self.clone();
        tokio::task::spawn_blocking(move || audit.record(actor, event))
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
    }
}
