// Every accepted handler shape registers: async fns and closures, with and
// without the Delivery, with any error that converts into a boxed error, and
// an #[idempotent] handler exactly like a plain one.
use std::sync::LazyLock;

use babel_idem::{Delivery, Envelope, InMemoryStore, Router, StoreError, idempotent, routes, urn};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

#[derive(Debug)]
struct BillingError;

impl std::fmt::Display for BillingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("billing failed")
    }
}

impl std::error::Error for BillingError {}

impl From<StoreError> for BillingError {
    fn from(_: StoreError) -> Self {
        BillingError
    }
}

async fn with_anyhow(_env: Envelope) -> Result<(), anyhow::Error> {
    Ok(())
}

async fn with_delivery(_env: Envelope, delivery: Delivery) -> Result<(), std::io::Error> {
    let _ = delivery.attempts();
    Ok(())
}

async fn with_own_error(_env: Envelope) -> Result<(), BillingError> {
    Ok(())
}

async fn with_string_error(_env: Envelope) -> Result<(), String> {
    Ok(())
}

#[idempotent(store = STORE)]
async fn idempotent_handler(_env: Envelope) -> Result<(), BillingError> {
    Ok(())
}

fn main() {
    let prefix = String::from("seen");
    let _router = Router::builder()
        .route(urn!("urn:babel:a:anyhow"), with_anyhow)
        .route(urn!("urn:babel:a:delivery"), with_delivery)
        .route(urn!("urn:babel:a:own-error"), with_own_error)
        .route(urn!("urn:babel:a:string-error"), with_string_error)
        .route(urn!("urn:babel:a:idempotent"), idempotent_handler)
        .route(urn!("urn:babel:a:closure"), move |env: Envelope| {
            let line = format!("{prefix} {}", env.urn());
            async move {
                println!("{line}");
                Ok::<(), anyhow::Error>(())
            }
        })
        .route(
            urn!("urn:babel:a:closure-delivery"),
            |_env: Envelope, delivery: Delivery| async move {
                let _ = delivery.header("traceparent");
                Ok::<(), StoreError>(())
            },
        )
        .build()
        .unwrap();

    let _table = routes! {
        "urn:babel:b:anyhow" => with_anyhow,
        "urn:babel:b:delivery" => with_delivery,
        "urn:babel:b:idempotent" => idempotent_handler,
    }
    .build()
    .unwrap();
}
