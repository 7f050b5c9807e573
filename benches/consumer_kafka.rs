//! The Kafka consumer benchmark: 100,000 records with 10% duplicate ids on a
//! 4-partition topic of the local Kafka-protocol broker, a handler that does
//! nothing, the seen-set in Redis with the Go SDK's layout (`EXISTS` /
//! `SET NX` on `<prefix><id>`). Each run reads a topic of its own, in a
//! group of its own, one after the other, alternating:
//!
//! 1. babel-idem: `Consumer` + `KafkaTransport` + a guarded no-op handler at
//!    concurrency 64, the seen-set in `store::Batched`; offsets committed
//!    as records settle (never past an unsettled one);
//! 2. the raw ceiling: an rdkafka consumer and the same Redis commands with
//!    the same clients (for each batch of ready records: one `MGET` and one
//!    `MULTI`/`SET NX`/`EXEC`, then one asynchronous commit of the batch's
//!    last offsets): the same commit policy, no decoding, no router, no
//!    guard;
//! 3. once, the Python SDK's worker (`babelqueue` 1.24 `KafkaTransport`,
//!    confluent-kafka, one record at a time, a synchronous commit after
//!    each; `babel-idem/tests/python/kafka_peer.py`), same seen-set, timed
//!    from its first record to its last.
//!
//! Reported: records/s and worker CPU per record; babel-idem's ratio to the
//! Python worker (goal >= 20x) and to the ceiling of the same round (goal
//! >= 0.8).
//!
//! ```text
//! source .ci/servers.sh; source .ci/python.sh
//! cargo bench --bench consumer_kafka --features kafka-transport,redis
//! BENCH_MESSAGES=20000 BENCH_PYTHON_MESSAGES=5000 BENCH_ROUNDS=2 cargo bench ...   # quicker
//! ```
//!
//! Without `BABEL_IDEM_KAFKA_URL` or `BABEL_IDEM_REDIS_URL` it prints
//! `skipped:`; without `BABEL_IDEM_PYTHON` the Python run is skipped.

#[path = "support/load.rs"]
#[allow(
    dead_code,
    reason = "the Python worker is timed from its own answer here"
)]
mod load;

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use babel_idem::store::{Batched, RedisStore};
use babel_idem::transport::KafkaTransport;
use babel_idem::{Consumer, Envelope, Router, run_once, urn};
use load::{bodies, cpu_seconds, env_count, id_of, remember_unseen};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use redis::AsyncCommands;
use redis::aio::ConnectionManager;

const PARTITIONS: i32 = 4;
const CONCURRENCY: usize = 64;

fn brokers(url: &str) -> String {
    url.trim_start_matches("kafka://").to_owned()
}

/// A topic of one run, filled with `count` records (keys: their ids); its
/// name, the seen-set's prefix and a group of its own.
async fn fill(url: &str, name: &str, count: usize) -> (String, String, String) {
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let topic = format!("bench-kafka-{name}-{run}");
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers(url))
        .create()
        .unwrap();
    let made = admin
        .create_topics(
            &[NewTopic::new(
                &topic,
                PARTITIONS,
                TopicReplication::Fixed(1),
            )],
            &AdminOptions::new(),
        )
        .await
        .unwrap();
    made.into_iter().for_each(|made| {
        made.unwrap();
    });
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers(url))
        .set("queue.buffering.max.messages", "1000000")
        .set("linger.ms", "5")
        .create()
        .unwrap();
    let bodies = bodies(&topic, count, &run);
    let mut pending = Vec::with_capacity(count);
    for body in &bodies {
        let record = FutureRecord::<[u8], [u8]>::to(&topic)
            .key(id_of(body))
            .payload(body);
        pending.push(producer.send_result(record).map_err(|(e, _)| e).unwrap());
    }
    for delivery in pending {
        delivery.await.unwrap().map_err(|(e, _)| e).unwrap();
    }
    let (prefix, group) = (format!("{topic}:bq:idemp:"), format!("{topic}-group"));
    (topic, prefix, group)
}

async fn cleanup(url: &str, redis_url: &str, topic: &str, prefix: &str) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers(url))
        .create()
        .unwrap();
    let _ = admin.delete_topics(&[topic], &AdminOptions::new()).await;
    let mut redis = redis::Client::open(redis_url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys: Vec<String> = redis.keys(format!("{prefix}*")).await.unwrap();
    for chunk in keys.chunks(10_000) {
        let _: () = redis.del(chunk).await.unwrap();
    }
}

struct Figures {
    name: String,
    messages: usize,
    seconds: f64,
    worker_cpu: f64,
}

impl Figures {
    fn since(name: &str, messages: usize, started: Instant, cpu_before: f64) -> Self {
        Figures {
            name: name.to_owned(),
            messages,
            seconds: started.elapsed().as_secs_f64(),
            worker_cpu: cpu_seconds(false) - cpu_before,
        }
    }

    fn rate(&self) -> f64 {
        self.messages as f64 / self.seconds
    }

    fn print(&self, python: Option<f64>, ceiling: Option<f64>) {
        println!(
            "{:<28} {:>8} recs {:>7.2} s {:>9.0} recs/s {:>7.1} µs worker CPU/rec{}{}",
            self.name,
            self.messages,
            self.seconds,
            self.rate(),
            self.worker_cpu / self.messages as f64 * 1e6,
            python.map_or(String::new(), |p| format!(
                "  {:>6.1}x python (goal >= 20x)",
                self.rate() / p
            )),
            ceiling.map_or(String::new(), |c| format!(
                "  {:>5.2} of the ceiling (goal >= 0.8)",
                self.rate() / c
            )),
        );
    }
}

async fn bench_babel_idem(url: &str, redis_url: &str, count: usize) -> Figures {
    let (topic, prefix, group) = fill(url, "ours", count).await;
    let transport = KafkaTransport::builder()
        .group(&group)
        .connect(url)
        .await
        .unwrap();
    // Batched: the deliveries in flight together share their round trips.
    let store = Batched::new(
        RedisStore::builder()
            .prefix(&prefix)
            .connect_lazy(redis_url)
            .unwrap(),
    );
    let router =
        Router::builder()
            .route(urn!("urn:babel:interop:created"), move |env: Envelope| {
                let store = store.clone();
                async move {
                    run_once(store, &env, async { Ok::<(), babel_idem::StoreError>(()) }).await
                }
            })
            .build()
            .unwrap();
    let consumer = Consumer::builder(router, transport.clone(), &topic)
        .concurrency(CONCURRENCY)
        .build()
        .unwrap();
    let progress = consumer.progress();
    let (cpu_before, started) = (cpu_seconds(false), Instant::now());
    let report = consumer
        .run_until(async {
            loop {
                let now = progress.report();
                if now.delivered as usize >= count && now.in_flight == 0 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await;
    let figures = Figures::since("babel-idem", count, started, cpu_before);
    assert_eq!(report.acked as usize, count, "{report:?}");
    transport.close().await;
    cleanup(url, redis_url, &topic, &prefix).await;
    figures
}

/// The raw ceiling: the same broker and Redis commands with the same
/// clients, and the same commit policy (after the seen-set's commands, the
/// batch's positions, asynchronously).
async fn bench_raw(url: &str, redis_url: &str, count: usize) -> Figures {
    let (topic, prefix, group) = fill(url, "raw", count).await;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers(url))
        .set("group.id", &group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    consumer.subscribe(&[&topic]).unwrap();
    let mut redis = ConnectionManager::new(redis::Client::open(redis_url).unwrap())
        .await
        .unwrap();
    let (cpu_before, started) = (cpu_seconds(false), Instant::now());
    let mut taken = 0;
    while taken < count {
        let mut batch = Vec::new();
        while batch.len() < CONCURRENCY {
            match consumer.poll(Duration::ZERO) {
                Some(message) => batch.push(message.unwrap().detach()),
                None => break,
            }
        }
        if batch.is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
            continue;
        }
        taken += batch.len();
        let keys: Vec<Vec<u8>> = batch
            .iter()
            .map(|record| [prefix.as_bytes(), id_of(record.payload().unwrap())].concat())
            .collect();
        remember_unseen(&mut redis, &keys).await;
        let mut positions: HashMap<i32, i64> = HashMap::new();
        for record in &batch {
            let next = positions.entry(record.partition()).or_default();
            *next = (*next).max(record.offset() + 1);
        }
        let mut list = TopicPartitionList::new();
        for (partition, next) in positions {
            list.add_partition_offset(&topic, partition, Offset::Offset(next))
                .unwrap();
        }
        consumer.commit(&list, CommitMode::Async).unwrap();
    }
    let figures = Figures::since("raw rdkafka ceiling", count, started, cpu_before);
    drop(consumer);
    cleanup(url, redis_url, &topic, &prefix).await;
    figures
}

/// The Python SDK's worker on a topic of its own; its time from its first
/// record to its last (the interpreter's start and the group join left
/// out, which favours it), checked to have taken every record.
async fn bench_python(url: &str, redis_url: &str, python: &Path, count: usize) -> Figures {
    let (topic, prefix, group) = fill(url, "py", count).await;
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("babel-idem/tests/python/kafka_peer.py");
    let mut command = Command::new(python);
    command.arg(script).args([
        "consume",
        url,
        &topic,
        "5.0",
        "--group",
        &group,
        "--redis",
        redis_url,
        "--seen-prefix",
        &prefix,
        "--noop",
        "1",
    ]);
    let cpu_before = cpu_seconds(true);
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .expect("run the Python worker");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let worker_cpu = cpu_seconds(true) - cpu_before;
    let answer: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        answer["processed"].as_u64(),
        Some(count as u64),
        "the Python worker took every record"
    );
    cleanup(url, redis_url, &topic, &prefix).await;
    Figures {
        name: "python-sdk".to_owned(),
        messages: count,
        seconds: answer["busy_seconds"].as_f64().unwrap(),
        worker_cpu,
    }
}

fn main() {
    let (Ok(url), Ok(redis_url)) = (
        std::env::var("BABEL_IDEM_KAFKA_URL"),
        std::env::var("BABEL_IDEM_REDIS_URL"),
    ) else {
        println!(
            "skipped: Kafka consumer benchmark: BABEL_IDEM_KAFKA_URL or BABEL_IDEM_REDIS_URL not set"
        );
        return;
    };
    let count = env_count("BENCH_MESSAGES", 100_000);
    let python_count = env_count("BENCH_PYTHON_MESSAGES", 10_000);
    let rounds = env_count("BENCH_ROUNDS", 3);
    let runtime = load::runtime();
    runtime.block_on(async {
        let python = match std::env::var("BABEL_IDEM_PYTHON") {
            Ok(python) if !python.is_empty() => {
                Some(bench_python(&url, &redis_url, Path::new(&python), python_count).await)
            }
            _ => {
                println!("skipped: the Python worker: BABEL_IDEM_PYTHON not set");
                None
            }
        };
        let mut rounds_run = Vec::new();
        for _ in 0..rounds {
            let ours = bench_babel_idem(&url, &redis_url, count).await;
            let ceiling = bench_raw(&url, &redis_url, count).await;
            rounds_run.push((ours, ceiling));
        }
        println!(
            "Kafka consumer benchmark: {count} records ({python_count} for Python), {PARTITIONS} partitions, 10% duplicate ids, no-op handler, seen-set in Redis"
        );
        let python_rate = python.as_ref().map(Figures::rate);
        if let Some(python) = &python {
            python.print(None, None);
        }
        for (ours, ceiling) in &rounds_run {
            ours.print(python_rate, Some(ceiling.rate()));
            ceiling.print(python_rate, None);
        }
    });
}
