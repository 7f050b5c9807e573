//! The RabbitMQ consumer benchmark: 100,000 messages with 10% duplicate ids
//! through the local RabbitMQ, a handler that does nothing, the seen-set in
//! Redis with the Go SDK's layout (`EXISTS` / `SET NX` on `<prefix><id>`).
//! Runs on the same broker, one after the other, each on a queue of its own:
//!
//! 1. babel-idem: `Consumer` + `AmqpTransport` + a guarded no-op handler, at
//!    prefetch 1, 64 and 512 (the consumer's concurrency = the prefetch),
//!    the seen-set in `store::Batched`;
//! 2. the Python SDK's worker (`babelqueue` 1.24 `PikaTransport`, which
//!    polls with `basic.get`; `babel-idem/tests/python/amqp_peer.py`), same seen-set;
//! 3. the raw ceiling at each prefetch: the same broker and Redis commands
//!    with the same clients (`basic.consume`, one `MGET` and one
//!    `MULTI`/`SET NX`/`EXEC` per batch of ready deliveries, one `basic.ack`
//!    with `multiple` per batch, sent in batch order), no decoding, no
//!    router, no guard.
//!
//! Reported: messages/s and worker CPU per message, the ratio of each
//! babel-idem run to the Python worker (goal >= 20x) and to the ceiling.
//!
//! Our workers and the ceiling run on one current-thread Tokio runtime, as
//! `examples/worker.rs` does (the Python worker is one thread too);
//! `BENCH_RUNTIME=multi_thread` runs them on the multi-threaded scheduler.
//!
//! ```text
//! source .ci/servers.sh; source .ci/python.sh
//! cargo bench --bench consumer_amqp --features amqp-transport,redis
//! BENCH_MESSAGES=20000 BENCH_PYTHON_MESSAGES=5000 cargo bench ...   # a quicker run
//! BENCH_RUNTIME=multi_thread cargo bench ...   # Tokio's multi-threaded scheduler
//! BENCH_PREFETCH=512 cargo bench ...   # one prefetch
//! ```
//!
//! Without `BABEL_IDEM_AMQP_URL` or `BABEL_IDEM_REDIS_URL` it prints
//! `skipped:`; without `BABEL_IDEM_PYTHON` the Python run is skipped.

#[path = "support/load.rs"]
mod load;

use std::path::Path;
use std::pin::Pin;
use std::time::{Duration, Instant};

use babel_idem::store::Batched;
use babel_idem::store::RedisStore;
use babel_idem::transport::AmqpTransport;
use babel_idem::{Consumer, Envelope, Router, run_once, urn};
use futures_core::Stream;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use load::{bodies, cpu_seconds, env_count, id_of, remember_unseen, run_python};
use redis::AsyncCommands;
use redis::aio::ConnectionManager;

const PREFETCHES: [u16; 3] = [1, 64, 512];

/// A queue of one run, filled; its seen-set prefix.
async fn fill(transport: &AmqpTransport, name: &str, count: usize) -> (String, String) {
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let queue = format!("bench-amqp-{name}-{run}");
    for chunk in bodies(&queue, count, &run).chunks(2000) {
        transport.publish_many(&queue, chunk).await.unwrap();
    }
    let prefix = format!("{queue}:bq:idemp:");
    (queue, prefix)
}

async fn cleanup(transport: &AmqpTransport, redis_url: &str, queue: &str, prefix: &str) {
    transport.delete_queue(queue).await.unwrap();
    let _ = transport.delete_queue(&format!("{queue}.dlq")).await;
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
    /// A worker's figures for `messages`, measured from `started` and from
    /// its CPU time `cpu_before`.
    fn since(name: String, messages: usize, started: Instant, cpu_before: f64) -> Self {
        Figures {
            name,
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
            "{:<24} {:>8} msgs {:>7.2} s {:>9.0} msgs/s {:>7.1} µs worker CPU/msg{}{}",
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
                "  {:>5.2} of the ceiling",
                self.rate() / c
            )),
        );
    }
}

async fn bench_babel_idem(url: &str, redis_url: &str, prefetch: u16, count: usize) -> Figures {
    let transport = AmqpTransport::builder()
        .prefetch(prefetch)
        .connect(url)
        .await
        .unwrap();
    let (queue, prefix) = fill(&transport, &format!("p{prefetch}"), count).await;
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
    let consumer = Consumer::builder(router, transport.clone(), &queue)
        .concurrency(usize::from(prefetch))
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
    let figures = Figures::since(
        format!("babel-idem prefetch {prefetch}"),
        count,
        started,
        cpu_before,
    );
    assert_eq!(report.acked as usize, count, "{report:?}");
    cleanup(&transport, redis_url, &queue, &prefix).await;
    transport.close().await;
    figures
}

/// The raw ceiling: what the babel-idem worker asks of the broker and of
/// Redis, with the same clients and nothing else. Each batch of deliveries
/// that are ready together is one task: `MGET` of their ids, `SET NX` of the
/// unseen ones in one `MULTI`/`EXEC`, then, once the batch before it has
/// acked, one `basic.ack` with `multiple` of its last delivery.
async fn bench_raw(url: &str, redis_url: &str, prefetch: u16, count: usize) -> Figures {
    let transport = AmqpTransport::connect(url).await.unwrap();
    let (queue, prefix) = fill(&transport, &format!("raw-p{prefetch}"), count).await;
    let connection = lapin::Connection::connect(url, lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel
        .basic_qos(prefetch, BasicQosOptions::default())
        .await
        .unwrap();
    let mut consumer = channel
        .basic_consume(
            queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let redis = ConnectionManager::new(redis::Client::open(redis_url).unwrap())
        .await
        .unwrap();
    let (cpu_before, started) = (cpu_seconds(false), Instant::now());
    let mut batches = tokio::task::JoinSet::new();
    let mut taken = 0;
    // Each batch acks after the one before it: a `multiple` ack covers
    // every earlier delivery of the channel.
    let (first_turn, mut turn) = tokio::sync::oneshot::channel::<()>();
    first_turn.send(()).unwrap();
    while taken < count {
        let first = std::future::poll_fn(|cx| Pin::new(&mut consumer).poll_next(cx)).await;
        let mut batch = vec![first.unwrap().unwrap()];
        while let std::task::Poll::Ready(Some(next)) =
            std::future::poll_fn(|cx| std::task::Poll::Ready(Pin::new(&mut consumer).poll_next(cx)))
                .await
        {
            batch.push(next.unwrap());
        }
        taken += batch.len();
        let (mut redis, prefix) = (redis.clone(), prefix.clone());
        let (next_turn, after_this) = tokio::sync::oneshot::channel::<()>();
        let my_turn = std::mem::replace(&mut turn, after_this);
        batches.spawn(async move {
            let keys: Vec<Vec<u8>> = batch
                .iter()
                .map(|delivery| [prefix.as_bytes(), id_of(&delivery.data)].concat())
                .collect();
            remember_unseen(&mut redis, &keys).await;
            my_turn.await.unwrap();
            let last = batch.last().expect("a batch holds one delivery or more");
            last.acker
                .ack(BasicAckOptions { multiple: true })
                .await
                .unwrap();
            let _ = next_turn.send(());
        });
        while let Some(done) = batches.try_join_next() {
            done.unwrap();
        }
    }
    while let Some(done) = batches.join_next().await {
        done.unwrap();
    }
    let figures = Figures::since(
        format!("raw ceiling prefetch {prefetch}"),
        count,
        started,
        cpu_before,
    );
    drop(consumer);
    let _ = connection.close(200, "done".into()).await;
    cleanup(&transport, redis_url, &queue, &prefix).await;
    transport.close().await;
    figures
}

async fn bench_python(url: &str, redis_url: &str, python: &Path, count: usize) -> Figures {
    let transport = AmqpTransport::connect(url).await.unwrap();
    let (queue, prefix) = fill(&transport, "py", count).await;
    let cpu_before = cpu_seconds(true);
    let seconds = run_python(
        python,
        "babel-idem/tests/python/amqp_peer.py",
        &[
            "consume",
            url,
            &queue,
            "0.2",
            "--redis",
            redis_url,
            "--seen-prefix",
            &prefix,
            "--noop",
            "1",
        ],
    )
    .await;
    let worker_cpu = cpu_seconds(true) - cpu_before;
    cleanup(&transport, redis_url, &queue, &prefix).await;
    transport.close().await;
    Figures {
        name: "python-sdk (basic.get)".to_owned(),
        messages: count,
        seconds,
        worker_cpu,
    }
}

fn main() {
    let (Ok(url), Ok(redis_url)) = (
        std::env::var("BABEL_IDEM_AMQP_URL"),
        std::env::var("BABEL_IDEM_REDIS_URL"),
    ) else {
        println!(
            "skipped: AMQP consumer benchmark: BABEL_IDEM_AMQP_URL or BABEL_IDEM_REDIS_URL not set"
        );
        return;
    };
    let count = env_count("BENCH_MESSAGES", 100_000);
    let python_count = env_count("BENCH_PYTHON_MESSAGES", count);
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
        // `BENCH_PREFETCH=<n>` runs one prefetch alone (to profile it).
        let prefetches = match std::env::var("BENCH_PREFETCH").ok().and_then(|p| p.parse().ok()) {
            Some(prefetch) => vec![prefetch],
            None => PREFETCHES.to_vec(),
        };
        let mut figures = Vec::new();
        for prefetch in prefetches {
            let ours = bench_babel_idem(&url, &redis_url, prefetch, count).await;
            let ceiling = bench_raw(&url, &redis_url, prefetch, count).await;
            figures.push((ours, ceiling));
        }
        println!(
            "AMQP consumer benchmark: {count} messages ({python_count} for Python), 10% duplicate ids, no-op handler, seen-set in Redis"
        );
        let python_rate = python.as_ref().map(Figures::rate);
        if let Some(python) = &python {
            python.print(None, None);
        }
        for (ours, ceiling) in &figures {
            ours.print(python_rate, Some(ceiling.rate()));
            ceiling.print(python_rate, None);
        }
    });
}
