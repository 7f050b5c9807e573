//! `examples/outbox.rs` as a user runs it, and as a fleet: consume,
//! transform, produce on PostgreSQL and Redis with four worker processes,
//! every credit delivered three times, one handler run in ten failing and
//! rolled back, one worker killed with SIGKILL: each credit leaves exactly
//! one effect row, one mark and one outgoing message, and the downstream
//! consumer's effects equal the distinct credits.
//!
//! Environment: `BABEL_IDEM_REDIS_URL`, `BABEL_IDEM_POSTGRES_URL`; without
//! them the tests print `skipped:`, and with `BABEL_IDEM_REQUIRE_SERVERS=1`
//! fail.
#![cfg(all(
    feature = "outbox",
    feature = "sqlite",
    feature = "postgres",
    feature = "redis-transport",
    feature = "amqp-transport"
))]

mod example_binary;
#[path = "../babel-idem/tests/outbox_support/mod.rs"]
mod outbox_support;
#[path = "../babel-idem/tests/store_contract/mod.rs"]
mod store_contract;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use babel_idem::transport::{Outgoing, RedisTransport};
use babel_idem::{Envelope, InMemoryStore, run_once};
use outbox_support::Broker;
use outbox_support::db::cli;
use serde_json::{Value, json};
use store_contract::servers::{POSTGRES_URL, REDIS_URL, server_url, unique_suffix};

/// The example's binary, built once per test run.
fn example() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| example_binary::build("outbox", &["--all-features"]))
}

fn spawn(args: &[String]) -> Child {
    Command::new(example())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the example")
}

async fn finish(child: Child) -> Output {
    let output = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "a panic: {stderr}");
    output
}

fn last_json(output: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|e| {
        panic!(
            "no JSON line ({e}): {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_moves_the_balance_once_per_credit_and_consumes_each_outgoing_id_once() {
    let Some(redis) = server_url(REDIS_URL, "outbox_example") else {
        return;
    };
    let output = finish(spawn(&["--redis".to_owned(), redis])).await;
    assert!(output.status.success(), "{output:?}");
    let line = last_json(&output);
    assert_eq!(line["delivered"], 15, "{line}");
    assert_eq!(line["balance_moved"], line["credited_once"], "{line}");
    assert_eq!(line["published"], 5, "{line}");
    assert_eq!(line["consumed"], 5, "{line}");
    assert_eq!(line["each_consumed_once"], true, "{line}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("balance moved by 60 for 5 credits"),
        "{stdout}"
    );
}

/// Every table the fleet wrote, read back.
async fn count_by(pool: &sqlx::PgPool, query: &str) -> HashMap<String, i64> {
    let rows: Vec<(String, i64)> = sqlx::query_as(query).fetch_all(pool).await.unwrap();
    rows.into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_with_failures_and_a_killed_worker_credits_marks_and_emits_once_per_input() {
    const TEST: &str = "outbox_consume_transform_produce";
    let (Some(redis), Some(postgres)) =
        (server_url(REDIS_URL, TEST), server_url(POSTGRES_URL, TEST))
    else {
        return;
    };
    let suffix = unique_suffix();
    let prefix = format!("bi_ctp_{suffix}");
    let (queue, out_queue) = (format!("bi-ctp-{suffix}"), format!("bi-ctp-{suffix}-out"));
    let worker_args = |until_idle: &str| -> Vec<String> {
        [
            "--redis",
            &redis,
            "--db",
            &postgres,
            "--tables",
            &prefix,
            "--queue",
            &queue,
            "--out-queue",
            &out_queue,
            "--inputs",
            "0",
            "--fail-rate",
            "0.1",
            "--no-relay",
            "--no-downstream",
            "--until-idle",
            until_idle,
            "--retry-after",
            "2s",
        ]
        .map(str::to_owned)
        .to_vec()
    };
    // One run on the empty queue migrates every table before the fleet starts.
    let migrated = finish(spawn(&worker_args("200ms"))).await;
    assert!(migrated.status.success(), "{migrated:?}");

    // 2,000 credits, each delivered three times.
    let transport = RedisTransport::connect(&redis).await.unwrap();
    let credits: Vec<Envelope> = (0..2_000)
        .map(|n| {
            Envelope::new(
                "urn:babel:ledger:credit",
                json!({"account": "a", "amount": 1 + n % 7}),
            )
            .with_queue(&queue)
        })
        .collect();
    let bodies: Vec<Vec<u8>> = credits
        .iter()
        .map(|c| c.encode_for_publish().unwrap())
        .collect();
    for _ in 0..3 {
        for chunk in bodies.chunks(500) {
            let batch: Vec<Outgoing<'_>> = chunk.iter().map(|b| Outgoing::new(&queue, b)).collect();
            let outcome = transport.publish_batch(&batch).await.unwrap();
            assert!(outcome.iter().all(Result::is_ok));
        }
    }

    let table = format!("{prefix}_outbox");
    let mut relay = Command::new(cli())
        .args([
            "relay",
            "--outbox",
            &postgres,
            "--outbox-table",
            &table,
            "--redis",
            &redis,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut workers: Vec<Child> = (0..4).map(|_| spawn(&worker_args("8s"))).collect();

    // Kill one worker once the fleet is under way.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&postgres)
        .await
        .unwrap();
    let effects = format!("SELECT count(*) FROM {prefix}_credits");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let done: i64 = sqlx::query_scalar(&effects).fetch_one(&pool).await.unwrap();
        if done >= 400 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the fleet made no progress"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut killed = workers.remove(0);
    killed.kill().unwrap();
    killed.wait().unwrap();
    for worker in workers {
        let output = finish(worker).await;
        assert!(output.status.success(), "{output:?}");
        let line = last_json(&output);
        assert_eq!(line["dead_lettered"], 0, "{line}");
    }
    // The relay stops on SIGTERM after its batch; a drain publishes the rest.
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(relay.id().to_string())
        .status();
    relay.wait().unwrap();
    let drained = Command::new(cli())
        .args([
            "relay",
            "--outbox",
            &postgres,
            "--outbox-table",
            &table,
            "--redis",
            &redis,
            "--drain",
        ])
        .output()
        .unwrap();
    assert!(drained.status.success(), "{drained:?}");

    let ids: Vec<String> = credits.iter().map(|c| c.meta.id.clone().unwrap()).collect();
    let credited = count_by(
        &pool,
        &format!("SELECT credit_id, count(*) FROM {prefix}_credits GROUP BY credit_id"),
    )
    .await;
    assert_eq!(credited.len(), ids.len(), "every credit applied");
    assert!(
        credited.values().all(|&n| n == 1),
        "each credit applied once"
    );
    let marks = count_by(
        &pool,
        &format!("SELECT message_id, count(*) FROM {prefix}_seen GROUP BY message_id"),
    )
    .await;
    assert!(
        ids.iter().all(|id| marks.get(id) == Some(&1)),
        "one mark per credit"
    );
    let outgoing = count_by(
        &pool,
        &format!(
            "SELECT (body::jsonb -> 'data' ->> 'credit_id'), count(*) FROM {table}
             WHERE status = 'published' GROUP BY 1"
        ),
    )
    .await;
    assert_eq!(outgoing.len(), ids.len(), "one outgoing message per credit");
    assert!(outgoing.values().all(|&n| n == 1), "each emitted once");

    // Downstream: a seen-set consumer of what the relay published.
    let landed = Broker::Redis(redis.clone()).drain(&out_queue).await;
    let seen = InMemoryStore::new();
    let mut effects_by_credit: HashMap<String, u32> = HashMap::new();
    for message in &landed {
        let env = Envelope::from_slice(&message.body).unwrap();
        let credit = env.data["credit_id"].as_str().unwrap().to_owned();
        run_once(&seen, &env, async {
            *effects_by_credit.entry(credit).or_default() += 1;
            Ok::<(), babel_idem::StoreError>(())
        })
        .await
        .unwrap();
    }
    eprintln!(
        "consume-transform-produce: {} messages downstream for {} credits",
        landed.len(),
        ids.len()
    );
    assert_eq!(effects_by_credit.len(), ids.len());
    assert!(effects_by_credit.values().all(|&n| n == 1));
    let traces: HashMap<&str, &str> = credits
        .iter()
        .map(|c| (c.meta.id.as_deref().unwrap(), c.trace_id.as_str()))
        .collect();
    for message in &landed {
        let env = Envelope::from_slice(&message.body).unwrap();
        let credit = env.data["credit_id"].as_str().unwrap();
        assert_eq!(env.trace_id, traces[credit], "the trace_id carries over");
        assert_ne!(env.meta.id.as_deref(), Some(credit), "a fresh id");
    }

    let _ = sqlx::raw_sql(&format!(
        "DROP TABLE IF EXISTS {prefix}_accounts, {prefix}_credits, {prefix}_seen, {table}"
    ))
    .execute(&pool)
    .await;
    Broker::Redis(redis)
        .delete(&[queue.clone(), format!("{queue}.dlq")])
        .await;
}
