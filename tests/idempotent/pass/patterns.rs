//! Parameter patterns stay as written: `mut`, tuple and struct destructuring,
//! `impl Trait` parameters, and a message named inside a destructured
//! parameter. The body may move or mutate the message: its key is taken first.

#[path = "../support.rs"]
mod support;

use std::fmt::Display;
use std::sync::LazyLock;

use babel_idem::{Envelope, InMemoryStore, Store, idempotent};
use support::{HandlerError, Runs};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);
static RUNS: Runs = Runs::new();

/// `mut` message, a destructured tuple, an `impl Trait` parameter; the body
/// mutates and then drops the envelope.
#[idempotent(store = STORE)]
async fn reshape(
    mut env: Envelope,
    (attempt, limit): (u32, u32),
    label: impl Display + Send,
) -> Result<(), HandlerError> {
    assert!(attempt <= limit, "{label}");
    env.data.insert("seen_by".into(), "reshape".into());
    RUNS.record(&env)?;
    drop(env);
    Ok(())
}

struct Delivery {
    env: Envelope,
    queue: &'static str,
}

/// The message is bound inside a struct pattern and named with `message`.
#[idempotent(store = STORE, scope = "delivery", message = env)]
async fn unpack(Delivery { env, queue }: Delivery, _: u8) -> Result<(), HandlerError> {
    assert_eq!(queue, "orders");
    RUNS.record(&env)
}

pub async fn exercise() {
    support::check_contract(&RUNS, |env| reshape(env, (1, 3), "attempt")).await;
    support::check_contract(&RUNS, |env| {
        unpack(
            Delivery {
                env,
                queue: "orders",
            },
            0,
        )
    })
    .await;
    let id = support::fresh_id();
    unpack(
        Delivery {
            env: support::envelope(&id),
            queue: "orders",
        },
        0,
    )
    .await
    .unwrap();
    assert!(STORE.seen(&format!("8:delivery:{id}")).await.unwrap());
}

fn main() {
    support::block_on(exercise());
}
