//! A BabelQueue worker on Redis or RabbitMQ: a `#[idempotent]` handler
//! behind a `Consumer`, on the queue layout the Python, PHP and Go SDKs share.
//!
//! ```text
//! cargo run --example worker --features redis-transport,amqp-transport,sqlite,redis,redis-cluster,postgres -- \
//!     --redis redis://127.0.0.1:6379/0 --queue orders --concurrency 32 \
//!     --until-idle 2s --store sqlite:target/worker.sqlite
//! ```
//!
//! The broker is `--redis URL`, `--amqp URL` (RabbitMQ,
//! `amqp://guest:guest@127.0.0.1:5672/%2f`) or, built with the feature
//! `kafka-transport`, `--kafka URL` (`kafka://127.0.0.1:9092`: the topic
//! `--queue` in the consumer group `--group`, default `babelqueue`),
//! exactly one of them; on
//! RabbitMQ the prefetch is twice the concurrency: the consumer reads as
//! many deliveries ahead as it handles at once. On Kafka the worker commits
//! what it settled before it exits.
//!
//! `--store` is the seen-set: `sqlite:PATH` (the default,
//! `sqlite:target/worker-seen.sqlite`), `redis://URL` or
//! `redis+cluster://HOST:PORT,...` (a Redis Cluster; the Go SDK's
//! `bq:idemp:` keys) or `postgres://URL`; the worker migrates what its mode
//! needs. The mode is seen-set mode, unless `--lease DURATION` asks for
//! claim mode with that lease (renewed while the handler runs): one run per
//! id across every worker process on the same store, where seen-set mode
//! promises it within one process. With a concurrency above 1 the consumer
//! sends the store calls of the deliveries in flight together (one `MGET`,
//! one `MULTI`/`EXEC` of `SET NX`); `--no-batch` keeps one call per message.
//!
//! `--retention DURATION` is how long the seen-set keeps each id it
//! marks (default `7d`; `none`, `forever` or `0`: until forgotten), on
//! every store: it must outlast the longest gap between two deliveries of
//! one id (a broker's redelivery, the time a message sits in the
//! dead-letter queue before a redrive, a replay), or a duplicate runs.
//! Seven days cover a dead-letter queue left over a long weekend and a
//! Kafka replay within the topic's default seven-day log retention; the
//! hour the PHP SDK and AWS Powertools keep covers redelivery alone. The
//! worker prints it at start, and its summary shows it; see
//! [`guide::retention`](babel_idem::guide::retention).
//!
//! `--urn` names the URN the job handles (default
//! `urn:babel:orders:created`).
//!
//! `--cached WINDOW` (a duration, `2s`) puts `store::Cached` in front of the
//! seen-set: an id this worker saw done is answered locally for `WINDOW`,
//! without a round trip. A `forget` made elsewhere (`babel-idem forget`,
//! `babel-idem dlq redrive --forget-in`) reaches this worker within
//! `WINDOW`; until then a replay of that id is skipped here.
//!
//! Durations are written as the `babel-idem` CLI writes them (`500ms`,
//! `30s`, `5m`, `2h`; a bare number is seconds). `--until-idle DURATION`:
//! the worker stops once it has been idle that long. Without
//! `--until-idle` the worker
//! runs until Ctrl-C or SIGTERM: it then stops reserving and lets the
//! deliveries in flight finish (within the consumer's shutdown timeout; what
//! is left stays reserved, and a worker's sweep returns it after its
//! deadline). With `--until-idle`, a broker or store that keeps failing
//! (for the idle time, at least 10 s) ends the run too: a failing broker is
//! not an empty queue. It prints progress every second on stderr and, last,
//! one JSON line on stdout that says why it stopped (`idle`, `signal`,
//! `broker_failing`, `store_failing`, the last with the `error`) and the
//! `retention` its marks were written with:
//!
//! ```text
//! {"delivered":1000,"ran":900,"skipped":100,"retried":0,"released":0,"timed_out":0,"taken_back":0,"dead_lettered":0,"stopped":"idle","retention":"7d"}
//! ```
//!
//! `delivered` counts every reservation, `ran` and `skipped` the guard's
//! decisions; `retried` deliveries went back with an attempt spent,
//! `released` without one (a store outage, or a copy of an id being run
//! when every place for copies waiting was taken: it comes again and is
//! skipped); `timed_out` handlers outlived the per-delivery timeout
//! (each retried as a failed attempt); `taken_back` deliveries were
//! settled after their reservation had lapsed and the sweep had returned
//! them to the queue (they come again); `dead_lettered` went to the
//! dead-letter queue.
//!
//! It exits with 0 when it stopped idle or on a signal with its broker and
//! store answering, and with 1 when it stopped while either was failing.

use std::process::ExitCode;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use babel_idem::consumer::Failing;
use babel_idem::router::Urn;
use babel_idem::store::{Batched, ClaimStore, MAX_TTL, Retention};
use babel_idem::store::{Cached, PostgresStore, RedisStore, SqliteStore};
use babel_idem::telemetry::metrics;
use babel_idem::transport::{AmqpTransport, RedisTransport, Transport};
use babel_idem::{Consumer, Envelope, Router, StoreError, idempotent};

/// The URN the job handles unless `--urn` names another.
const ORDER_CREATED: &str = "urn:babel:orders:created";

/// How long the seen-set keeps a mark unless `--retention` says otherwise:
/// longer than the longest gap between two deliveries of one id (see the
/// module docs and `RETENTION_HELP`).
const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// The store, chosen at start from `--store`: every backend the worker
/// takes can claim, so one store serves both modes.
static STORE: OnceLock<Arc<dyn ClaimStore>> = OnceLock::new();

/// Claim mode's lease, from `--lease`.
static LEASE: OnceLock<Duration> = OnceLock::new();

fn store() -> &'static Arc<dyn ClaimStore> {
    STORE
        .get()
        .expect("the store is set before the worker starts")
}

/// The job, in seen-set mode: runs once per `meta.id` in this process,
/// whatever the broker redelivers.
#[idempotent(store = store())]
async fn on_order_created(env: Envelope) -> Result<(), StoreError> {
    handle(&env);
    Ok(())
}

/// The same job in claim mode: one run per `meta.id` across processes.
#[idempotent(store = store(), lease = *LEASE.get().expect("claim mode has a lease"))]
async fn on_order_created_claimed(env: Envelope) -> Result<(), StoreError> {
    handle(&env);
    Ok(())
}

fn handle(env: &Envelope) {
    tracing::debug!(order = %env.data.get("order_id").unwrap_or(&serde_json::Value::Null), "order handled");
}

struct Options {
    redis: String,
    amqp: String,
    kafka: String,
    group: String,
    queue: String,
    concurrency: usize,
    until_idle: Option<Duration>,
    store: String,
    cached: Option<Duration>,
    batch: bool,
    urn: String,
    lease: Option<Duration>,
    /// How long each mark is kept; `None`: until forgotten.
    retention: Option<Duration>,
}

const USAGE: &str = "usage: worker (--redis URL | --amqp URL | --kafka URL) --queue NAME [--concurrency N] [--until-idle DURATION] \
                     [--store sqlite:PATH|redis://URL|redis+cluster://HOST:PORT,...|postgres://URL] [--cached WINDOW] [--no-batch] [--urn URN] \
                     [--lease DURATION] [--retention DURATION|none] [--group NAME (Kafka)]";

/// What `--help` says about `--retention`.
const RETENTION_HELP: &str = "--retention DURATION: how long the seen-set keeps each id it marks, on \
     every store (default 7d; none, forever or 0: until forgotten). It must outlast the longest \
     gap between two deliveries of one id: a broker's redelivery, the time a message sits in the \
     dead-letter queue before a redrive, a replay; a mark that expires earlier lets a duplicate \
     run. 7d covers a dead-letter queue left over a long weekend and a Kafka replay within the \
     topic's default 7-day log retention; the PHP SDK's and AWS Powertools' 1h covers redelivery \
     alone.";

fn parse_options() -> Result<Options, String> {
    let mut options = Options {
        redis: String::new(),
        amqp: String::new(),
        kafka: String::new(),
        // The family's consumer group (`transport::kafka::DEFAULT_GROUP`).
        group: "babelqueue".to_owned(),
        queue: String::new(),
        concurrency: 32,
        until_idle: None,
        store: "sqlite:target/worker-seen.sqlite".to_owned(),
        cached: None,
        batch: true,
        urn: ORDER_CREATED.to_owned(),
        lease: None,
        retention: Some(DEFAULT_RETENTION),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--redis" => options.redis = value()?,
            "--amqp" => options.amqp = value()?,
            "--kafka" => options.kafka = value()?,
            "--group" => options.group = value()?,
            "--queue" => options.queue = value()?,
            "--concurrency" => {
                let text = value()?;
                options.concurrency = text
                    .parse()
                    .map_err(|_| format!("--concurrency must be a whole number, got {text:?}"))?;
            }
            "--until-idle" => options.until_idle = Some(duration("--until-idle", &value()?)?),
            "--store" => options.store = value()?,
            "--cached" => options.cached = Some(duration("--cached", &value()?)?),
            "--no-batch" => options.batch = false,
            "--urn" => options.urn = value()?,
            "--lease" => {
                let lease = duration("--lease", &value()?)?;
                if lease.is_zero() {
                    return Err("--lease must be longer than 0s".to_owned());
                }
                options.lease = Some(lease);
            }
            "--retention" => options.retention = retention(&value()?)?,
            "--help" | "-h" => return Err(format!("{USAGE}\n\n{RETENTION_HELP}")),
            other => return Err(format!("unknown flag {other:?}\n{USAGE}")),
        }
    }
    let brokers = [&options.redis, &options.amqp, &options.kafka]
        .iter()
        .filter(|url| !url.is_empty())
        .count();
    if brokers != 1 || options.queue.is_empty() {
        return Err(format!(
            "--queue and exactly one of --redis, --amqp and --kafka are required\n{USAGE}"
        ));
    }
    Ok(options)
}

/// A duration written as the `babel-idem` CLI writes one: a whole number
/// and a unit, `ms`, `s`, `m`, `h` or `d` (`500ms`, `30s`, `5m`, `2h`); a
/// bare number is seconds.
fn duration(flag: &str, text: &str) -> Result<Duration, String> {
    let refused = || {
        format!(
            "{flag}: {text:?} is not a duration: write a whole number and a unit \
             (ms, s, m, h, d), as in 30s, 5m, 2h; a bare number is seconds"
        )
    };
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let number: u64 = text[..digits].parse().map_err(|_| refused())?;
    let millis_per_unit: u64 = match &text[digits..] {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(refused()),
    };
    let millis = number.checked_mul(millis_per_unit).ok_or_else(refused)?;
    Ok(Duration::from_millis(millis))
}

/// `--retention`: `none`, `forever` or a zero duration keep marks until
/// forgotten (`None`); any other duration up to [`MAX_TTL`] is the TTL.
fn retention(text: &str) -> Result<Option<Duration>, String> {
    if matches!(text, "none" | "forever") {
        return Ok(None);
    }
    let ttl = duration("--retention", text).map_err(|refused| format!("{refused}, or none"))?;
    if ttl > MAX_TTL {
        return Err(format!(
            "--retention: {text:?} is longer than the longest TTL a store keeps \
             (36500d); for marks kept until forgotten, write none"
        ));
    }
    Ok((!ttl.is_zero()).then_some(ttl))
}

/// The store `--store` names, its marks kept for `retention` (`None`:
/// until forgotten), in [`Cached`] with `--cached`. Claim mode
/// (`claims`) makes its tables too and sends its claims and commits through
/// [`Batched`] (the consumer batches seen-set calls by itself).
async fn open_store(
    spec: &str,
    retention: Option<Duration>,
    cached: Option<Duration>,
    claims: bool,
) -> Result<Arc<dyn ClaimStore>, StoreError> {
    fn cache<S: ClaimStore + 'static>(store: S, cached: Option<Duration>) -> Arc<dyn ClaimStore> {
        match cached {
            Some(window) => Arc::new(Cached::builder(store).window(window).build()),
            None => Arc::new(store),
        }
    }
    fn wrap<S: ClaimStore + 'static>(
        store: S,
        cached: Option<Duration>,
        claims: bool,
    ) -> Arc<dyn ClaimStore> {
        if claims {
            cache(Batched::new(store), cached)
        } else {
            cache(store, cached)
        }
    }
    Ok(if let Some(path) = spec.strip_prefix("sqlite:") {
        if let Some(dir) = std::path::Path::new(path).parent() {
            // A missing directory is made; a failure shows when SQLite opens the file.
            let _ = std::fs::create_dir_all(dir);
        }
        let mut builder = SqliteStore::builder();
        if let Some(ttl) = retention {
            builder = builder.ttl(ttl);
        }
        let store = builder.open(path).await?;
        if claims {
            store.migrate_claims().await?;
        }
        wrap(store, cached, claims)
    } else if [
        "redis://",
        "rediss://",
        "redis+cluster://",
        "rediss+cluster://",
    ]
    .iter()
    .any(|scheme| spec.starts_with(scheme))
    {
        let mut builder = RedisStore::builder();
        if let Some(ttl) = retention {
            builder = builder.ttl(ttl);
        }
        wrap(builder.connect_lazy(spec)?, cached, claims)
    } else if spec.starts_with("postgres://") || spec.starts_with("postgresql://") {
        let mut builder = PostgresStore::builder();
        if let Some(ttl) = retention {
            builder = builder.ttl(ttl);
        }
        let store = builder.connect_lazy(spec)?;
        store.migrate().await?;
        if claims {
            store.migrate_claims().await?;
        }
        wrap(store, cached, claims)
    } else {
        return Err(StoreError::new(
            babel_idem::store::StoreOperation::Open,
            "worker",
            format!(
                "--store must be sqlite:PATH, redis://URL, redis+cluster://HOST:PORT,... \
                 or postgres://URL, got {spec:?}"
            ),
        ));
    })
}

async fn run(options: Options) -> Result<(), Box<dyn std::error::Error>> {
    // The broker first: a bad URL or a refused connection is the likelier mistake.
    if !options.kafka.is_empty() {
        return run_kafka(options).await;
    }
    if options.amqp.is_empty() {
        let transport = RedisTransport::connect(&options.redis).await?;
        serve(transport, options).await
    } else {
        // The consumer holds its concurrency plus as many read ahead.
        let prefetch = u16::try_from(options.concurrency.saturating_mul(2)).unwrap_or(u16::MAX);
        let transport = AmqpTransport::builder()
            .prefetch(prefetch)
            .connect(&options.amqp)
            .await?;
        serve(transport, options).await
    }
}

/// The worker on Kafka: settled records are committed before it exits
/// (what is not settled stays uncommitted, for the group's next owner).
#[cfg(feature = "kafka-transport")]
async fn run_kafka(options: Options) -> Result<(), Box<dyn std::error::Error>> {
    let transport = babel_idem::transport::KafkaTransport::builder()
        .group(&options.group)
        .connect(&options.kafka)
        .await?;
    let closing = transport.clone();
    let served = serve(transport, options).await;
    closing.close().await;
    served
}

#[cfg(not(feature = "kafka-transport"))]
async fn run_kafka(_: Options) -> Result<(), Box<dyn std::error::Error>> {
    Err("--kafka needs the worker built with the feature kafka-transport".into())
}

async fn serve<T: Transport>(
    transport: T,
    options: Options,
) -> Result<(), Box<dyn std::error::Error>> {
    let store = open_store(
        &options.store,
        options.retention,
        options.cached,
        options.lease.is_some(),
    )
    .await?;
    let retention = options.retention.map_or(Retention::Forever, Retention::Ttl);
    eprintln!("worker: the seen-set keeps each id it marks for {retention}");
    STORE.set(store).map_err(|_| "the store was already set")?;
    let urn = Urn::parse(options.urn.clone())?;
    let router = match options.lease {
        Some(lease) => {
            LEASE.set(lease).map_err(|_| "the lease was already set")?;
            Router::builder().route(urn, on_order_created_claimed)
        }
        None => Router::builder().route(urn, on_order_created),
    }
    .build()?;
    let consumer = Consumer::builder(router, transport, &options.queue)
        .concurrency(options.concurrency)
        .batch_store_calls(options.batch)
        .build()?;

    let progress = consumer.progress();
    let printer = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.tick().await;
        loop {
            tick.tick().await;
            let now = progress.report();
            eprintln!(
                "worker: delivered {} acked {} retried {} released {} timed out {} \
                 taken back {} dead-lettered {} in flight {}",
                now.delivered,
                now.acked,
                now.retried,
                now.released,
                now.timed_out,
                now.lapsed,
                now.dead_lettered,
                now.in_flight
            );
        }
    });
    let (idle, failing) = (consumer.progress(), consumer.progress());
    let before = metrics::counts();
    let stopped = OnceLock::new();
    let report = consumer
        .run_until(async {
            let idle = async {
                match options.until_idle {
                    Some(quiet) => idle.idle_for(quiet).await,
                    None => std::future::pending().await,
                }
            };
            // A run to the end of the queue ends, with an error, when its
            // broker or store keeps failing instead; a worker that runs
            // until stopped waits the outage out.
            let failing = async {
                match options.until_idle {
                    Some(quiet) => failing.failing_for(quiet.max(FAILING_PATIENCE)).await,
                    None => std::future::pending().await,
                }
            };
            let why = tokio::select! {
                () = idle => "idle",
                () = failing => "failing",
                () = stop_signal() => {
                    eprintln!("worker: stopping; in-flight deliveries finish");
                    "signal"
                }
            };
            let _ = stopped.set(why);
        })
        .await;
    printer.abort();
    let decided = metrics::counts().since(&before);
    let stopped = match (report.failing, stopped.get().copied().unwrap_or("signal")) {
        (Some(Failing::Broker), _) => "broker_failing",
        (Some(Failing::Store), _) => "store_failing",
        (_, why) => why,
    };
    let error = match report.failing {
        Some(Failing::Broker) => consumer
            .progress()
            .reserve_error()
            .unwrap_or_else(|| "reserving failed".to_owned()),
        Some(_) => "the seen-set store does not answer".to_owned(),
        None => String::new(),
    };
    // Written by hand to keep the documented key order.
    print!(
        concat!(
            r#"{{"delivered":{},"ran":{},"skipped":{},"retried":{},"released":{},"#,
            r#""timed_out":{},"taken_back":{},"dead_lettered":{},"stopped":"{stopped}","#,
            r#""retention":"{retention}""#
        ),
        report.delivered,
        decided.get(metrics::Decision::Ran),
        decided.get(metrics::Decision::Skipped),
        report.retried,
        report.released,
        report.timed_out,
        report.lapsed,
        report.dead_lettered,
        stopped = stopped,
        retention = retention,
    );
    if error.is_empty() {
        println!("}}");
        return Ok(());
    }
    println!(r#","error":{}}}"#, serde_json::Value::from(error.as_str()));
    Err(format!(
        "stopped while the {} was failing: {error}",
        report.failing.map_or_else(String::new, |f| f.to_string())
    )
    .into())
}

/// How long a run to the end of the queue waits out a failing broker or
/// store, at least, before it gives up.
const FAILING_PATIENCE: Duration = Duration::from_secs(10);

/// Ctrl-C, or SIGTERM (what a process manager sends). A signal that cannot
/// be listened for never fires: the worker then runs until it is killed.
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut terminate) = signal(SignalKind::terminate()) {
            tokio::select! {
                result = tokio::signal::ctrl_c() => {
                    if result.is_err() {
                        terminate.recv().await;
                    }
                }
                _ = terminate.recv() => {}
            }
            return;
        }
    }
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}

// One thread: the worker waits on the broker and the store, and a second
// scheduler thread only adds wakeups between threads (the consumer benchmark
// measures the two; see the README's "Performance").
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let options = match parse_options() {
        Ok(options) => options,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    match run(options).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("worker: {error}");
            ExitCode::FAILURE
        }
    }
}
