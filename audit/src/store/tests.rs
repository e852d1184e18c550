//! The log over a store other writers share: an in-memory store stands in
//! for the database (one lock, like the head row's), so the log's side of
//! sharing (others' entries joining the tree in order, one checkpoint for
//! all, a rolled-back or edited store refused) is tested without one.

use std::sync::{Arc, Mutex};

use ed25519_dalek::SigningKey;

use super::*;
use crate::merkle::leaf_hash;
use crate::{Actor, AuditLog, Event, Outcome};

#[derive(Debug, Default)]
struct Shared {
    entries: Vec<Stored>,
    checkpoints: Vec<(u64, String)>,
    down: bool,
}

/// One "database"; each log gets its own handle on it.
#[derive(Clone, Debug, Default)]
struct MemoryStore(Arc<Mutex<Shared>>);

impl MemoryStore {
    fn shared(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.0.lock().unwrap()
    }

    fn check(&self, shared: &Shared) -> Result<(), AuditError> {
        if shared.down {
            return Err(AuditError::Unavailable("the test store is down".into()));
        }
        Ok(())
    }
}

impl Store for MemoryStore {
    fn place(&self) -> &str {
        "memory"
    }

    fn is_shared(&self) -> bool {
        true
    }

    fn scan(&self, from: u64, each: &mut dyn FnMut(Stored)) -> Result<(), AuditError> {
        let shared = self.shared();
        self.check(&shared)?;
        for stored in shared.entries.iter().skip(from as usize) {
            if leaf_hash(&stored.entry) != stored.leaf {
                return Err(AuditError::Damaged {
                    place: "memory".into(),
                    index: stored.index,
                    why: "edited".into(),
                });
            }
            each(stored.clone());
        }
        Ok(())
    }

    fn append(
        &self,
        known: u64,
        others: &mut dyn FnMut(Stored),
        build: &mut Build<'_>,
    ) -> Result<u64, AuditError> {
        let mut shared = self.shared();
        self.check(&shared)?;
        let first = shared.entries.len() as u64;
        for stored in shared.entries.iter().skip(known as usize) {
            others(stored.clone());
        }
        for (i, (entry, leaf)) in build(first).into_iter().enumerate() {
            shared.entries.push(Stored {
                index: first + i as u64,
                entry,
                leaf,
            });
        }
        Ok(first)
    }

    fn read(&self, from: u64, to: u64) -> Result<Vec<Vec<u8>>, AuditError> {
        let shared = self.shared();
        self.check(&shared)?;
        Ok(shared.entries[from as usize..to as usize]
            .iter()
            .map(|s| s.entry.clone())
            .collect())
    }

    fn latest_checkpoint(&self) -> Result<Option<String>, AuditError> {
        let shared = self.shared();
        self.check(&shared)?;
        Ok(shared
            .checkpoints
            .iter()
            .max_by_key(|c| c.0)
            .map(|c| c.1.clone()))
    }

    fn keep_checkpoint(&self, size: u64, note: &str) -> Result<(), AuditError> {
        let mut shared = self.shared();
        self.check(&shared)?;
        match shared.checkpoints.iter().find(|c| c.0 == size) {
            Some((_, kept)) if kept != note => Err(AuditError::Checkpoint {
                place: "memory".into(),
                why: "a different checkpoint of this size".into(),
            }),
            Some(_) => Ok(()),
            None => {
                shared.checkpoints.push((size, note.to_string()));
                Ok(())
            }
        }
    }
}

fn key() -> SigningKey {
    SigningKey::from_bytes(&[7; 32])
}

fn open(store: &MemoryStore) -> AuditLog {
    AuditLog::open_store(Box::new(store.clone()), key(), crate::DEFAULT_ORIGIN)
        .unwrap()
        .0
}

fn action(target: &str) -> Event {
    Event::AdminAction {
        route: "test".into(),
        target: target.into(),
        outcome: Outcome::Accepted,
    }
}

fn target_of(log: &AuditLog, index: u64) -> String {
    let bytes = log.entries(index, index + 1).unwrap();
    match crate::Entry::from_bytes(&bytes[0]).unwrap().event {
        Event::AdminAction { target, .. } => target,
        other => panic!("{other:?}"),
    }
}

#[test]
fn two_writers_share_one_sequence_and_one_checkpoint() {
    let store = MemoryStore::default();
    let a = open(&store);
    let b = open(&store);
    // Interleaved, from threads of both: every index taken once.
    let writers: Vec<_> = (0..4)
        .map(|t| {
            let log = if t % 2 == 0 { a.clone() } else { b.clone() };
            std::thread::spawn(move || {
                (0..25)
                    .map(|i| {
                        let tag = format!("{t}-{i}");
                        (log.append(Actor::Gateway, action(&tag)).unwrap(), tag)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let acked: Vec<(u64, String)> = writers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    let mut indexes: Vec<u64> = acked.iter().map(|a| a.0).collect();
    indexes.sort_unstable();
    assert_eq!(indexes, (0..100).collect::<Vec<_>>());

    // Each log learns the other's entries and signs the same checkpoint.
    let (note_a, note_b) = (a.checkpoint().unwrap(), b.checkpoint().unwrap());
    assert_eq!(note_a, note_b);
    assert_eq!((a.size(), b.size()), (100, 100));
    assert_eq!(a.root(100).unwrap(), b.root(100).unwrap());
    for (index, tag) in &acked {
        assert_eq!(&target_of(&a, *index), tag);
        assert_eq!(&target_of(&b, *index), tag);
    }
    // A proof from one verifies against the other's checkpoint.
    let proof = b.inclusion_proof(17, 100).unwrap();
    crate::merkle::verify_inclusion(&a.leaf(17).unwrap(), 17, 100, &proof, &a.root(100).unwrap())
        .unwrap();
}

#[test]
fn an_unavailable_store_refuses_appends_and_loses_nothing_acknowledged() {
    let store = MemoryStore::default();
    let log = open(&store);
    let first = log.append(Actor::Gateway, action("before")).unwrap();
    store.shared().down = true;
    let error = log.append(Actor::Gateway, action("during")).unwrap_err();
    assert!(matches!(error, AuditError::Unavailable(_)), "{error}");
    assert!(log.checkpoint().is_err());
    store.shared().down = false;
    let next = log.append(Actor::Gateway, action("after")).unwrap();
    assert_eq!(next, first + 1, "the refused entry took no index");
    assert_eq!(target_of(&log, first), "before");
    assert_eq!(target_of(&log, next), "after");
}

#[test]
fn a_store_rolled_back_or_edited_is_refused_at_open() {
    let store = MemoryStore::default();
    let log = open(&store);
    for i in 0..5 {
        log.append(Actor::Gateway, action(&i.to_string())).unwrap();
    }
    log.checkpoint().unwrap();
    drop(log);

    let saved = store.shared().entries.clone();
    store.shared().entries.truncate(3);
    let error =
        AuditLog::open_store(Box::new(store.clone()), key(), crate::DEFAULT_ORIGIN).unwrap_err();
    assert!(
        matches!(
            error,
            AuditError::RolledBack {
                checkpoint_size: 5,
                log_size: 3,
                ..
            }
        ),
        "{error}"
    );

    // An entry replaced by another whose leaf matches its bytes: only the
    // signed checkpoint's root shows it.
    let mut forged = saved.clone();
    let bytes = crate::Entry {
        index: 2,
        time: crate::time::Timestamp(0),
        actor: Actor::Gateway,
        event: action("forged"),
    }
    .to_bytes();
    forged[2] = Stored {
        index: 2,
        leaf: leaf_hash(&bytes),
        entry: bytes,
    };
    store.shared().entries = forged;
    let error =
        AuditLog::open_store(Box::new(store.clone()), key(), crate::DEFAULT_ORIGIN).unwrap_err();
    assert!(
        matches!(error, AuditError::Diverged { size: 5, .. }),
        "{error}"
    );

    // Another key cannot take over the log.
    store.shared().entries = saved;
    let error = AuditLog::open_store(
        Box::new(store.clone()),
        SigningKey::from_bytes(&[8; 32]),
        crate::DEFAULT_ORIGIN,
    )
    .unwrap_err();
    assert!(matches!(error, AuditError::Checkpoint { .. }), "{error}");
    assert!(error.to_string().contains("same audit key"), "{error}");
}
