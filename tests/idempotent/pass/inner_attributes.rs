//! A body that opens with inner attributes keeps them: they go back inside
//! the rewritten body, where they still cover all of it (as with tracing's
//! `#[instrument]`). The crate denies unused variables, so this only
//! compiles if `#![allow(unused_variables)]` still applies to the body.
#![deny(unused_variables)]

#[path = "../support.rs"]
mod support;

use std::sync::LazyLock;

use babel_idem::{Envelope, InMemoryStore, idempotent};
use support::{HandlerError, Runs};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);
static RUNS: Runs = Runs::new();

#[idempotent(store = STORE)]
async fn on_order_created(env: Envelope) -> Result<(), HandlerError> {
    #![allow(unused_variables)]
    #![allow(clippy::let_unit_value)]
    let draft = ();
    RUNS.record(&env)
}

struct Billing;

impl Billing {
    #[idempotent(store = STORE, scope = "billing")]
    async fn charge(&self, env: &Envelope) -> Result<(), HandlerError> {
        #![allow(unused_variables)]
        let receipt = "unused";
        RUNS.record(env)
    }
}

pub async fn exercise() {
    support::check_contract(&RUNS, on_order_created).await;
    let billing = &Billing;
    support::check_contract(&RUNS, |env| async move { billing.charge(&env).await }).await;
}

fn main() {
    support::block_on(exercise());
}
