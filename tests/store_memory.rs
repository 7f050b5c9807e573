//! The store contract against `InMemoryStore`, the reference store.

#[macro_use]
mod store_contract;

use store_contract::MemoryBackend;

store_contract_tests!(MemoryBackend::create);
