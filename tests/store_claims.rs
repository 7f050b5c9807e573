//! The claim section of the store contract (`store_contract::claim`),
//! run against every store that implements `ClaimStore`, with real Redis
//! and PostgreSQL (`BABEL_IDEM_REDIS_URL`, `BABEL_IDEM_POSTGRES_URL`).

#[macro_use]
mod store_contract;

mod sqlite {
    use crate::store_contract::SqliteBackend;
    claim_contract_tests!(SqliteBackend::create);
}

#[cfg(feature = "redis")]
mod redis {
    use crate::store_contract::RedisBackend;
    claim_contract_tests!(RedisBackend::create);
}

#[cfg(feature = "postgres")]
mod postgres {
    use crate::store_contract::PostgresBackend;
    claim_contract_tests!(PostgresBackend::create);
}
