//! Change notices between replicas: a replica that changes shared state
//! sends `NOTIFY` in the same transaction ([`notify`]), so the notice goes
//! out exactly when the change commits; every replica [`listen`]s and
//! rereads what changed.
//!
//! A notice can be missed (the LISTEN connection dropped, the database
//! restarted, the reader fell behind). So the listener also asks for a
//! full reread ([`Change::Resync`]) every time its LISTEN is (re)established
//! and on a timer: a missed notice delays a change by at most the resync
//! period, never loses it.
//!
//! Channels are per database in PostgreSQL, not per schema, so a channel's
//! name carries a hash of the schema: gateways on other schemas of the
//! same database (tests, other deployments) never wake each other.

use std::time::Duration;

use tokio::sync::mpsc;

use crate::{Db, StateError};

/// Most bytes of a notice's payload (PostgreSQL's limit is 8000).
pub const MAX_PAYLOAD_BYTES: usize = 1024;

/// Longest wait between two tries to reconnect the LISTEN connection.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// What a [`listen`]er reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Reread everything: the LISTEN was just (re)established, or the
    /// periodic resync is due.
    Resync,
    /// Another (or this) replica changed what `payload` names.
    Changed(String),
}

/// The channel for `topic` in `db`'s schema.
pub fn channel(schema: &str, topic: &str) -> String {
    // FNV-1a, 64 bits: stable across builds and platforms, which the
    // sender and listeners (perhaps different versions) must agree on.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in schema.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("bulkhead_{hash:016x}_{topic}")
}

/// Sends a notice on `topic` from `client`; inside a transaction it goes
/// out when (and only if) the transaction commits.
pub async fn notify(
    client: &impl tokio_postgres::GenericClient,
    schema: &str,
    topic: &str,
    payload: &str,
) -> Result<(), StateError> {
    let payload: String = if payload.len() > MAX_PAYLOAD_BYTES {
        // A listener rereads everything for a notice it cannot use.
        String::new()
    } else {
        payload.to_string()
    };
    client
        .execute(
            "SELECT pg_notify($1, $2)",
            &[&channel(schema, topic), &payload],
        )
        .await?;
    Ok(())
}

/// Listens on `topic` until the receiver is dropped, reconnecting with
/// backoff. The first report is a [`Change::Resync`] once the LISTEN is in
/// place (so a reader that loads after it misses nothing), then one per
/// reconnection and one every `resync_every`.
pub fn listen(db: Db, topic: &'static str, resync_every: Duration) -> mpsc::Receiver<Change> {
    let (sender, receiver) = mpsc::channel(crate::NOTIFICATION_BUFFER);
    tokio::spawn(run(db, topic, resync_every, sender));
    receiver
}

async fn run(db: Db, topic: &'static str, resync_every: Duration, sender: mpsc::Sender<Change>) {
    let channel = channel(db.schema(), topic);
    let mut backoff = Duration::from_millis(100);
    loop {
        match db.dedicated().await {
            Ok(mut connection) => {
                // The channel is ours (hex and `_`): no quoting trouble.
                let listen = format!("LISTEN \"{channel}\"");
                match connection.client.batch_execute(&listen).await {
                    Ok(()) => {
                        backoff = Duration::from_millis(100);
                        tracing::debug!(%channel, "listening for state changes");
                        if sender.send(Change::Resync).await.is_err() {
                            return;
                        }
                        let mut timer = tokio::time::interval(resync_every);
                        timer.tick().await;
                        loop {
                            tokio::select! {
                                notice = connection.notifications.recv() => match notice {
                                    Some(notice) => {
                                        let change = if notice.payload().is_empty() {
                                            Change::Resync
                                        } else {
                                            Change::Changed(notice.payload().to_string())
                                        };
                                        if sender.send(change).await.is_err() {
                                            return;
                                        }
                                    }
                                    None => break,
                                },
                                _ = timer.tick() => {
                                    if sender.send(Change::Resync).await.is_err() {
                                        return;
                                    }
                                }
                                () = sender.closed() => return,
                            }
                        }
                        tracing::warn!(%channel, "the LISTEN connection ended; reconnecting");
                    }
                    Err(e) => tracing::warn!(
                        %channel,
                        error = %crate::error::error_text(&e),
                        "LISTEN failed; retrying"
                    ),
                }
            }
            Err(e) => tracing::warn!(%channel, "cannot listen for state changes: {e}"),
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = sender.closed() => return,
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}
