//! A user message type with its own `MessageId`, named with `message = ...`,
//! and a message that is the receiver itself (`message = self`).

#[path = "../support.rs"]
mod support;

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU32, Ordering};

use babel_idem::{InMemoryStore, MessageId, idempotent};
use support::HandlerError;

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);
static CHARGES: AtomicU32 = AtomicU32::new(0);

#[derive(Clone)]
struct Payment {
    idempotency_key: String,
    cents: u64,
}

impl MessageId for Payment {
    fn message_id(&self) -> Option<&str> {
        Some(self.idempotency_key.as_str()).filter(|key| !key.is_empty())
    }
}

#[idempotent(store = STORE, message = payment)]
async fn charge(retries: u8, payment: Payment) -> Result<(), HandlerError> {
    if payment.cents == 0 || retries > 3 {
        return Err(HandlerError::Refused);
    }
    CHARGES.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// An `impl Trait` message: any type with an id.
#[idempotent(store = STORE, message = message, scope = "any")]
async fn any_message(message: impl MessageId + Send + Sync) -> Result<(), HandlerError> {
    let _ = message.message_id();
    CHARGES.fetch_add(10, Ordering::SeqCst);
    Ok(())
}

impl Payment {
    #[idempotent(store = STORE, message = self, scope = "refund")]
    async fn refund(self) -> Result<(), HandlerError> {
        CHARGES.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }
}

pub async fn exercise() {
    let payment = Payment {
        idempotency_key: support::fresh_id(),
        cents: 1250,
    };
    let before = CHARGES.load(Ordering::SeqCst);
    charge(0, payment.clone()).await.unwrap();
    charge(0, payment.clone()).await.unwrap();
    assert_eq!(CHARGES.load(Ordering::SeqCst), before + 1, "charged once");

    let refused = Payment {
        cents: 0,
        ..payment.clone()
    };
    let other = Payment {
        idempotency_key: support::fresh_id(),
        ..refused
    };
    assert!(charge(0, other.clone()).await.is_err());
    charge(0, Payment { cents: 5, ..other }).await.unwrap();
    assert_eq!(
        CHARGES.load(Ordering::SeqCst),
        before + 2,
        "an error left the key unmarked"
    );

    let keyless = Payment {
        idempotency_key: String::new(),
        cents: 1,
    };
    charge(0, keyless.clone()).await.unwrap();
    charge(0, keyless).await.unwrap();
    assert_eq!(
        CHARGES.load(Ordering::SeqCst),
        before + 4,
        "no key fails open"
    );

    let mid = CHARGES.load(Ordering::SeqCst);
    any_message(payment.clone()).await.unwrap();
    any_message(payment.clone()).await.unwrap();
    assert_eq!(
        CHARGES.load(Ordering::SeqCst),
        mid + 10,
        "an `impl MessageId` dedupes"
    );
    CHARGES.fetch_sub(10, Ordering::SeqCst);

    payment.clone().refund().await.unwrap();
    payment.refund().await.unwrap();
    assert_eq!(CHARGES.load(Ordering::SeqCst), before + 3, "refunded once");
}

fn main() {
    support::block_on(exercise());
}
