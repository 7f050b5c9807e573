//! The messages, schemas and router the schema-on-consume tests share.

use std::sync::{Arc, LazyLock, Mutex};

use babel_idem::schema::{Schema, Schemas};
use babel_idem::{Message, Router};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

pub(crate) const CREATED: &str = "urn:babel:orders:created";
pub(crate) const NOTED: &str = "urn:babel:orders:noted";

#[derive(Debug, Serialize, Deserialize, Message)]
#[message(urn = "urn:babel:orders:created")]
pub(crate) struct OrderCreated {
    pub(crate) order_id: u64,
    pub(crate) currency: String,
}

#[derive(Debug, Serialize, Deserialize, Message)]
#[message(urn = "urn:babel:orders:noted")]
pub(crate) struct OrderNoted {
    pub(crate) order_id: u64,
}

/// The schema of `orders:created`; `orders:noted` has none.
pub(crate) static SCHEMAS: LazyLock<Schemas> = LazyLock::new(|| {
    Schemas::new().with(
        CREATED,
        Schema::from_value(json!({
            "type": "object",
            "required": ["order_id", "currency"],
            "properties": {
                "order_id": {"type": "integer", "minimum": 1},
                "currency": {"enum": ["USD", "EUR"]}
            },
            "additionalProperties": false
        }))
        .unwrap(),
    )
});

/// An envelope of `urn` whose `data` is the JSON text `data`, as written
/// (member order included).
pub(crate) fn envelope_bytes(urn: &str, data: &str) -> Vec<u8> {
    format!(
        r#"{{"job":"{urn}","trace_id":"7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b","data":{data},"meta":{{"id":"f1e2d3c4-b5a6-4789-90ab-cdef01234567","queue":"orders","lang":"python","schema_version":1,"created_at":1749132727000}},"attempts":0}}"#
    )
    .into_bytes()
}

/// What the handlers were handed, one entry a run, encoded again.
#[derive(Clone, Default)]
pub(crate) struct Runs(Arc<Mutex<Vec<Value>>>);

impl Runs {
    pub(crate) fn ran(
        &self,
        handed: &impl Serialize,
    ) -> std::future::Ready<Result<(), anyhow::Error>> {
        let handed = serde_json::to_value(handed).unwrap();
        self.0.lock().unwrap().push(handed);
        std::future::ready(Ok(()))
    }

    pub(crate) fn handed(&self) -> Vec<Value> {
        self.0.lock().unwrap().clone()
    }

    pub(crate) fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

/// Typed handlers of both URNs, recording their runs, with [`SCHEMAS`].
pub(crate) fn typed_router(runs: &Runs) -> Router {
    let (created, noted) = (runs.clone(), runs.clone());
    Router::builder()
        .handle(move |order: OrderCreated| created.ran(&order))
        .handle(move |note: OrderNoted| noted.ran(&note))
        .schemas(SCHEMAS.clone())
        .build()
        .unwrap()
}
