//! A fleet of worker processes in one consumer group on a Kafka-protocol
//! broker: rebalances while records are in flight.
//!
//! Three worker processes (this test binary, started again with
//! `--ignored --exact kafka_worker`) consume a 6-partition topic in one
//! group, 8 handlers each, with a persistent seen-set on the shared Redis.
//! 3,000 ids are each written twice (the second copy after all the firsts);
//! a record's key is its id. One worker is `kill -9`ed mid-run and a
//! fourth joins mid-run: the group rebalances twice with records in flight.
//!
//! Checked, from the effects each handler counts in Redis and from the
//! transport's own events (each worker prints every `reserved`, `settled`
//! and `commit` event of the binding, with its partition and offset):
//! - every id has its effect, once, except ids whose run the kill cut
//!   between effect and mark (at most the killed worker's handlers);
//! - no commit ever passed an unsettled record: a worker's commit of
//!   offset `o` on a partition comes after every record it reserved there
//!   below `o` (since it was last given the partition) was settled;
//! - nothing is left uncommitted once the workers stop.
#![cfg(all(feature = "kafka-transport", feature = "redis"))]

mod consumer_support;
mod store_contract;
mod support;

use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use babel_idem::Consumer;
use babel_idem::store::RedisStore;
use babel_idem::transport::KafkaTransport;
use consumer_support::{PATIENCE, effect_router, envelope_with_id, eventually};
use redis::AsyncCommands;
use store_contract::servers::{REDIS_URL, server_url};
use support::kafka::{ONE_RECORD_PER_BATCH, WorkTopic as Topic, kafka_url};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

const IDS: usize = 3000;
const PARTITIONS: i32 = 6;
const HANDLERS: usize = 8;
/// The workers' consumer-group session timeout.
const SESSION_TIMEOUT: Duration = Duration::from_secs(6);
const WORKER_ENV: &str = "BABEL_IDEM_KAFKA_FLEET_WORKER";
/// The binding's events' target.
const TARGET: &str = "babel_idem::transport::kafka";

// ---------------------------------------------------------------- worker

/// Prints each event of the binding's, and every warning, as one line on
/// stderr: `kafka-event <worker> <message> <partition> <offset>` for a
/// record's or a partition's event, `kafka-log <worker> <level> <target>
/// <fields>` for the rest (assignments, failed commits, lapsed records).
struct Events(usize);

#[derive(Default)]
struct Fields {
    message: String,
    partition: Option<i64>,
    offset: Option<i64>,
    rest: String,
}

impl Visit for Fields {
    fn record_i64(&mut self, field: &Field, value: i64) {
        match field.name() {
            "partition" => self.partition = Some(value),
            "offset" => self.offset = Some(value),
            name => self.rest.push_str(&format!(" {name}={value}")),
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.record_i64(field, i64::try_from(value).unwrap_or(i64::MAX));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            name => self.rest.push_str(&format!(" {name}={value:?}")),
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for Events {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let metadata = event.metadata();
        match (fields.partition, fields.offset) {
            (Some(partition), Some(offset)) if metadata.target() == TARGET => eprintln!(
                "kafka-event {} {} {partition} {offset}",
                self.0, fields.message
            ),
            (partition, _) => eprintln!(
                "kafka-log {} {} {} {}{}{}",
                self.0,
                metadata.level(),
                metadata.target(),
                fields.message,
                partition
                    .map(|p| format!(" partition={p}"))
                    .unwrap_or_default(),
                fields.rest
            ),
        }
    }
}

/// One worker process: consumes until its stdin closes, then stops and
/// commits what it settled.
#[test]
#[ignore = "a fleet worker process: started by the fleet test, not on its own"]
fn kafka_worker() {
    let Ok(spec) = std::env::var(WORKER_ENV) else {
        eprintln!("kafka_worker runs only when the fleet test starts it ({WORKER_ENV})");
        return;
    };
    let parts: Vec<&str> = spec.split(' ').collect();
    let [worker, kafka, redis_url, topic, group] = parts[..] else {
        panic!("{WORKER_ENV} is `<worker> <kafka> <redis> <topic> <group>`, got {spec:?}");
    };
    let worker: usize = worker.parse().expect("a worker number");
    let subscriber = tracing_subscriber::registry().with(Events(worker).with_filter(
        tracing_subscriber::filter::filter_fn(|metadata| {
            metadata.target() == TARGET || *metadata.level() <= tracing::Level::WARN
        }),
    ));
    tracing::subscriber::set_global_default(subscriber).expect("one subscriber");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    runtime.block_on(async move {
        let transport = KafkaTransport::builder()
            .group(group)
            .session_timeout(SESSION_TIMEOUT)
            .client_setting(ONE_RECORD_PER_BATCH.0, ONE_RECORD_PER_BATCH.1)
            .connect(kafka)
            .await
            .expect("connect");
        let store = RedisStore::builder()
            .prefix(format!("{topic}:seen:"))
            .connect_lazy(redis_url)
            .expect("a store");
        let consumer = Consumer::builder(
            effect_router(store, redis_url, format!("{topic}:effects")),
            transport,
            topic,
        )
        .concurrency(HANDLERS)
        .build()
        .expect("a consumer");
        let stdin_closed = async {
            let _ = tokio::task::spawn_blocking(|| {
                let mut sink = Vec::new();
                std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink)
            })
            .await;
        };
        consumer.run_until(stdin_closed).await;
        consumer.transport().close().await;
        eprintln!("kafka-worker {worker} stopped");
    });
}

// ---------------------------------------------------------------- the test

/// Every worker's event lines, in the order they came.
type Lines = Arc<Mutex<Vec<String>>>;

fn spawn_worker(worker: usize, spec: &str, lines: &Lines) -> Child {
    let mut child = Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--ignored", "--exact", "kafka_worker", "--nocapture"])
        .env(WORKER_ENV, format!("{worker} {spec}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start a worker process");
    let stderr = child.stderr.take().expect("a piped stderr");
    let lines = Arc::clone(lines);
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if !line.starts_with("kafka-event ") {
                eprintln!("{line}");
            }
            lines.lock().expect("the lines' lock").push(line);
        }
    });
    child
}

/// Checks every commit in `lines` against the records its worker
/// reserved and settled before it; how many records were reserved, settled
/// and commits checked.
fn assert_no_commit_passed_an_unsettled_record(lines: &[String]) -> (usize, usize, usize) {
    // Per (worker, partition): reserved offsets not settled yet.
    let mut unsettled: HashMap<(usize, i64), BTreeSet<i64>> = HashMap::new();
    let (mut reserved, mut settled, mut commits) = (0, 0, 0);
    for line in lines {
        let parts: Vec<&str> = line.split(' ').collect();
        let ["kafka-event", worker, message, partition, offset] = parts[..] else {
            continue;
        };
        let worker: usize = worker.parse().unwrap();
        let (partition, offset): (i64, i64) = (partition.parse().unwrap(), offset.parse().unwrap());
        let open = unsettled.entry((worker, partition)).or_default();
        match message {
            "reserved" => {
                reserved += 1;
                open.insert(offset);
            }
            "settled" => {
                settled += 1;
                open.remove(&offset);
            }
            "revoked" => open.clear(),
            "commit" => {
                commits += 1;
                if let Some(lowest) = open.first() {
                    assert!(
                        offset <= *lowest,
                        "worker {worker} committed {offset} on partition {partition} with {lowest} unsettled"
                    );
                }
            }
            _ => {}
        }
    }
    (reserved, settled, commits)
}

/// Which worker owns each partition, from the `assigned` and `revoked`
/// events in `lines` (the last one of a partition wins).
fn owners(lines: &[String]) -> HashMap<i64, usize> {
    let mut owners = HashMap::new();
    for line in lines {
        let parts: Vec<&str> = line.split(' ').collect();
        match parts[..] {
            ["kafka-log", worker, _, _, "assigned", partition, ..] => {
                let partition = partition.trim_start_matches("partition=");
                if let (Ok(worker), Ok(partition)) = (worker.parse(), partition.parse()) {
                    owners.insert(partition, worker);
                }
            }
            ["kafka-event", worker, "revoked", partition, _] => {
                if let (Ok(worker), Ok(partition)) =
                    (worker.parse::<usize>(), partition.parse::<i64>())
                    && owners.get(&partition) == Some(&worker)
                {
                    owners.remove(&partition);
                }
            }
            _ => {}
        }
    }
    owners
}

/// What a stalled run looks like: the ids that did not run and where
/// their records are, the group's commits, the dead letters, which workers
/// are alive, and each worker's last assignments and warnings.
async fn diagnosis(
    topic: &Topic,
    group: &str,
    ids: &[String],
    ran: &HashMap<String, i64>,
    workers: &mut [Child],
    lines: &Lines,
) -> String {
    let mut out = Vec::new();
    let missing: BTreeSet<&String> = ids.iter().filter(|id| !ran.contains_key(*id)).collect();
    out.push(format!("{} of {IDS} ids have no effect", missing.len()));
    let mut where_missing: HashMap<i32, Vec<i64>> = HashMap::new();
    for record in topic.records(&topic.name).await {
        let key = String::from_utf8_lossy(record.key.as_deref().unwrap_or_default()).into_owned();
        if missing.contains(&key) {
            where_missing
                .entry(record.partition)
                .or_default()
                .push(record.offset);
        }
    }
    for (partition, offsets) in &where_missing {
        out.push(format!(
            "partition {partition}: {} records of those ids, offsets {:?}..{:?}",
            offsets.len(),
            offsets.iter().min(),
            offsets.iter().max()
        ));
    }
    out.push(format!(
        "group commits: {:?}",
        topic.all_committed(group).await
    ));
    out.push(format!(
        "dead letters: {}",
        topic.records(&topic.dlq()).await.len()
    ));
    for (worker, child) in workers.iter_mut().enumerate() {
        out.push(format!("worker {worker}: {:?}", child.try_wait()));
    }
    let lines = lines.lock().expect("the lines' lock").clone();
    let logs: Vec<&String> = lines
        .iter()
        .filter(|line| !line.starts_with("kafka-event "))
        .collect();
    out.push(format!(
        "the workers' last {} of {} log lines:",
        logs.len().min(60),
        logs.len()
    ));
    out.extend(
        logs.iter()
            .skip(logs.len().saturating_sub(60))
            .map(|line| line.to_string()),
    );
    let mut last: HashMap<(String, String), &String> = HashMap::new();
    for line in lines.iter().filter(|line| line.starts_with("kafka-event ")) {
        let parts: Vec<&str> = line.split(' ').collect();
        if let [_, worker, _, partition, _] = parts[..] {
            last.insert((worker.to_owned(), partition.to_owned()), line);
        }
    }
    let mut last: Vec<&String> = last.into_values().collect();
    last.sort();
    out.push("each worker's last event per partition:".to_owned());
    out.extend(last.into_iter().cloned());
    out.join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_with_a_kill_and_a_join_runs_every_id_once_and_never_commits_past_unsettled_work() {
    let test =
        "a_fleet_with_a_kill_and_a_join_runs_every_id_once_and_never_commits_past_unsettled_work";
    let (Some(kafka), Some(redis_url)) = (kafka_url(test), server_url(REDIS_URL, test)) else {
        return;
    };
    let topic = Topic::new(&kafka, PARTITIONS, 0).await;
    let group = topic.group();
    let ids: Vec<String> = (0..IDS).map(|n| format!("fleet-{n:04}")).collect();
    let records: Vec<(Vec<u8>, Vec<u8>)> = (0..2)
        .flat_map(|copy| {
            ids.iter().enumerate().map(move |(n, id)| {
                let body = envelope_with_id(id, "", (copy * IDS + n) as u64).to_vec();
                (id.clone().into_bytes(), body)
            })
        })
        .collect();
    topic.produce_many(&records).await;

    let spec = format!("{kafka} {redis_url} {} {group}", topic.name);
    let lines = Lines::default();
    let mut workers: Vec<Child> = (0..3).map(|w| spawn_worker(w, &spec, &lines)).collect();

    let client = redis::Client::open(redis_url.as_str()).unwrap();
    let effects = format!("{}:effects", topic.name);
    let counts = || async {
        let mut connection = client.get_multiplexed_async_connection().await.unwrap();
        connection
            .hgetall::<_, HashMap<String, i64>>(&effects)
            .await
            .unwrap()
    };
    eventually("a third of the ids ran", || async {
        counts().await.len() >= IDS / 3
    })
    .await;
    workers[0].kill().expect("kill -9 a worker");
    let _ = workers[0].wait();
    // tansu drops a dead member only when a rebalance begins after its
    // group session timed out (Kafka also expires it on its own): the join
    // waits out the killed worker's session timeout, and its rebalance
    // hands the killed worker's partitions on.
    tokio::time::sleep(2 * SESSION_TIMEOUT).await;
    eventually("half of the ids ran", || async {
        counts().await.len() >= IDS / 2
    })
    .await;
    workers.push(spawn_worker(3, &spec, &lines));
    eventually("the survivors own every partition", || async {
        let owners = owners(&lines.lock().expect("the lines' lock"));
        owners.len() == PARTITIONS as usize && owners.values().all(|worker| *worker != 0)
    })
    .await;
    let patience = tokio::time::Instant::now() + PATIENCE;
    while counts().await.len() < IDS {
        if tokio::time::Instant::now() >= patience {
            let ran = counts().await;
            panic!(
                "not every id ran within {PATIENCE:?}\n{}",
                diagnosis(&topic, &group, &ids, &ran, &mut workers, &lines).await
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The second copies are skipped, not run: wait until every record is
    // settled and committed, then stop the workers (each commits on stop).
    let patience = tokio::time::Instant::now() + Duration::from_secs(120);
    while let Err(behind) = topic.all_committed(&group).await {
        assert!(
            tokio::time::Instant::now() < patience,
            "the group never committed every record: {behind}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for worker in workers.iter_mut().skip(1) {
        drop(worker.stdin.take());
        let status = worker.wait().expect("a worker stops");
        assert!(status.success(), "a worker failed: {status}");
    }
    if let Err(behind) = topic.all_committed(&group).await {
        panic!("something is left uncommitted: {behind}");
    }

    let counts = counts().await;
    let twice: Vec<(&String, &i64)> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.len() <= HANDLERS && twice.iter().all(|(_, n)| **n == 2),
        "ids run more than once beyond the killed worker's handlers: {twice:?}"
    );
    let lines = lines.lock().unwrap().clone();
    let (reserved, settled, commits) = assert_no_commit_passed_an_unsettled_record(&lines);
    // Every record was reserved and settled at least once, by some worker:
    // the check above saw the whole run, not a silent part of it.
    assert!(
        reserved >= 2 * IDS && settled >= 2 * IDS,
        "{reserved} reserved, {settled} settled"
    );
    assert!(commits > 0, "the workers reported no commit");
    eprintln!(
        "{} ids ran once, {} twice (cut by the kill); {reserved} reservations, {settled} settles, {commits} commits checked",
        counts.len() - twice.len(),
        twice.len()
    );
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let seen: Vec<String> = connection
        .keys(format!("{}:seen:*", topic.name))
        .await
        .unwrap();
    let _: () = redis::cmd("DEL")
        .arg(&effects)
        .arg(&seen)
        .query_async(&mut connection)
        .await
        .unwrap();
}
