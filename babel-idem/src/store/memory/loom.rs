//! The UUID table's publish / read / rearrange protocol, model-checked:
//! loom runs each test under every interleaving of its threads with at most
//! `LOOM_MAX_PREEMPTIONS` preemptions (and every value a relaxed or acquire
//! load may return) and fails on the first that breaks an assertion. Run by
//! `.ci/loom.sh`, which bounds the preemptions at 4:
//! `RUSTFLAGS="--cfg loom" cargo test -p babel-idem --release --lib loom`.
//!
//! Each test prints how many interleavings loom explored.
//!
//! The writer runs on the model's main thread and the reader on a spawned
//! one: loom's exploration remembers only the last access to each atomic,
//! so a race between a reader's load and a *later* store is found from the
//! store's side only when the reader runs after it in the first schedule.

use std::sync::atomic::{AtomicUsize, Ordering};

use loom::sync::Arc;
use loom::thread;

use super::InMemoryStore;
use super::canonical_uuid::Uuid;
use super::uuid_table::{LARGE_FROM, MIN_SLOTS, Probe, UuidTable};

/// The lock-free lookups, each with whether it may pass (answer `None`)
/// where no rearrangement runs: `read_home` does where its first slots do
/// not tell, and the store then goes on to `read`.
type Reader = fn(&UuidTable, Uuid, u64) -> Option<Probe>;
const READERS: [(&str, Reader, bool); 2] = [
    ("read", UuidTable::read, false),
    ("read_home", UuidTable::read_home, true),
];

/// Runs `body` under loom and prints how many interleavings it explored.
fn explore(name: &str, body: impl Fn() + Sync + Send + 'static) {
    let explored = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = std::sync::Arc::clone(&explored);
    loom::model(move || {
        counter.fetch_add(1, Ordering::Relaxed);
        body();
    });
    println!(
        "loom: {name}: {} interleavings explored",
        explored.load(Ordering::Relaxed)
    );
}

fn uuid(n: u64) -> String {
    format!("f1e2d3c4-b5a6-4789-90ab-{n:012x}")
}

/// A reader racing the writer's `fill` sees either an empty slot or the
/// whole UUID with its stamp: never its high word with a stale low word
/// (which would make `[HIGH, 0]` look remembered) or a stale stamp. In the
/// smallest table the lock-free read takes slots one at a time; in one of
/// `LARGE_FROM` slots, from home 4, a window of four.
#[test]
fn loom_reader_racing_an_insert_sees_nothing_or_the_whole_id() {
    for (slots, hash, home) in [(MIN_SLOTS, 5, 1), (LARGE_FROM, 4, 4)] {
        reader_racing_an_insert(slots, hash, home);
    }
}

fn reader_racing_an_insert(slots: usize, hash: u64, home: usize) {
    const HIGH: u64 = 0xf1e2_d3c4_b5a6_4789;
    explore(
        &format!("reader racing an insert, {slots} slots"),
        move || {
            let table = Arc::new(UuidTable::new(true));
            table.lay_out(slots, Vec::new(), |_| 0);
            let reader = {
                let table = Arc::clone(&table);
                thread::spawn(move || {
                    for (name, read, may_pass) in READERS {
                        assert!(
                            !matches!(read(&table, [HIGH, 0], hash), Some(Probe::Found { .. })),
                            "{name}: a half-published slot matched another UUID"
                        );
                        match read(&table, [HIGH, 42], hash) {
                            None if may_pass => {}
                            Some(Probe::Found { index, stamp: 7 } | Probe::Vacant { index })
                                if index == home => {}
                            other => panic!("{name} saw {other:?}"),
                        }
                    }
                })
            };
            if let Probe::Vacant { index } = table.probe([HIGH, 42], hash) {
                table.fill(index, [HIGH, 42], 7);
            }
            reader.join().unwrap();
            assert_eq!(
                table.probe([HIGH, 42], hash),
                Probe::Found {
                    index: home,
                    stamp: 7
                }
            );
        },
    );
}

/// A reader racing the writer's `bury` of one UUID still finds the UUID
/// that collided with it and sits further along the probe sequence.
#[test]
fn loom_reader_racing_a_removal_probes_past_the_tombstone() {
    const HASH: u64 = 9;
    let (first, second) = ([10, 1], [11, 2]);
    explore("reader racing a removal", move || {
        let table = Arc::new(UuidTable::new(false));
        for uuid in [first, second] {
            if let Probe::Vacant { index } = table.probe(uuid, HASH) {
                table.fill(index, uuid, 0);
            }
        }
        let reader = {
            let table = Arc::clone(&table);
            thread::spawn(move || {
                assert_eq!(
                    table.probe(second, HASH),
                    Probe::Found { index: 2, stamp: 0 },
                    "a tombstone ended the probe"
                );
                assert!(matches!(
                    table.probe(first, HASH),
                    Probe::Found { index: 1, .. } | Probe::Vacant { index: 3 }
                ));
            })
        };
        if let Probe::Found { index, .. } = table.probe(first, HASH) {
            table.bury(index);
        }
        reader.join().unwrap();
        assert_eq!(table.probe(first, HASH), Probe::Vacant { index: 3 });
    });
}

/// A reader racing the writer's in-place `rebuild` (which drops a
/// tombstone and doubles the table into a second segment) either gets the
/// right answer or is told to ask again: never a forgotten UUID found, never
/// a live one missed.
#[test]
fn loom_reader_racing_a_rebuild_gets_the_answer_or_none() {
    const HASH: u64 = 1;
    let (forgotten, kept, also_kept) = ([10, 1], [11, 2], [12, 3]);
    explore("reader racing a rebuild", move || {
        let table = Arc::new(UuidTable::new(false));
        for uuid in [forgotten, kept, also_kept] {
            if let Probe::Vacant { index } = table.probe(uuid, HASH) {
                table.fill(index, uuid, 0);
            }
        }
        if let Probe::Found { index, .. } = table.probe(forgotten, HASH) {
            table.bury(index);
        }
        let reader = {
            let table = Arc::clone(&table);
            thread::spawn(move || {
                for (name, read, _) in READERS {
                    let kept_read = read(&table, kept, HASH);
                    assert!(
                        matches!(kept_read, None | Some(Probe::Found { .. })),
                        "{name}: a live UUID was missed: {kept_read:?}"
                    );
                    let forgotten_read = read(&table, forgotten, HASH);
                    assert!(
                        matches!(forgotten_read, None | Some(Probe::Vacant { .. })),
                        "{name}: a forgotten UUID was found: {forgotten_read:?}"
                    );
                }
            })
        };
        assert_eq!(table.rebuild(|_| HASH), 2);
        reader.join().unwrap();
        assert_eq!(table.slots(), 2 * MIN_SLOTS);
        assert!(matches!(table.read(kept, HASH), Some(Probe::Found { .. })));
        assert!(matches!(
            table.read(forgotten, HASH),
            Some(Probe::Vacant { .. })
        ));
    });
}

/// The whole store, one shard: the writer forgets one id and remembers
/// another, which fills the table to its limit and so rearranges it in
/// place, into a second segment. A reader racing that (through the lock
/// when its lock-free read is not taken) sees every other remembered id
/// throughout, never sees the forgotten one come back, and sees the new one
/// once the writer is done.
#[test]
fn loom_reader_racing_a_table_rearrangement_loses_no_id() {
    explore("reader racing a table rearrangement", || {
        let store = Arc::new(
            InMemoryStore::builder()
                .shards(1)
                .build()
                .expect("no TTL to refuse"),
        );
        let limit = store.shards[0].0.uuids.fill_limit() as u64;
        for n in 0..limit {
            store.insert(&uuid(n));
        }
        let slots_before = store.shards[0].0.uuids.slots();
        let reader = {
            let store = Arc::clone(&store);
            thread::spawn(move || {
                let forgotten_at_first = !store.contains(&uuid(0));
                assert!(
                    store.contains(&uuid(1)),
                    "an id was lost in the replacement"
                );
                assert!(
                    store.contains(&uuid(limit - 1)),
                    "an id was lost in the replacement"
                );
                assert!(
                    !forgotten_at_first || !store.contains(&uuid(0)),
                    "a forgotten id came back"
                );
            })
        };
        store.remove(&uuid(0));
        store.insert(&uuid(limit));
        reader.join().unwrap();
        assert!(store.contains(&uuid(limit)));
        assert!(!store.contains(&uuid(0)));
        assert_eq!(store.len(), limit as usize);
        // The point of the test: the table really was rearranged (a rebuild
        // drops the tombstone `remove` left) and grew into a new segment.
        assert_eq!(store.shards[0].0.uuids.slots(), 2 * slots_before);
        assert_eq!(store.shards[0].0.lock().uuid_filled, limit as usize);
    });
}
