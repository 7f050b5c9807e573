//! How babel-idem decides, stores and settles, page by page: the reference
//! the API docs point to.
//!
//! | page | what it holds |
//! |---|---|
//! | [`modes`] | the three modes' decision tables: seen-set (the default), claim (lease, fence, release, park), transactional |
//! | [`batches`] | many messages per store round trip: the batch store calls, [`Guard::run_batch`](crate::guard::Guard::run_batch), [`Batched`](crate::store::Batched) |
//! | [`stores`] | every backend's layout on one page: the in-memory store, the SQLite and PostgreSQL tables (their DDL), the Redis keys (the Go and PHP layouts) and the roles of its Lua scripts |
//! | [`consumers`] | from a raw delivery to a [`Disposition`](crate::router::Disposition), and how the consumer settles each one on Redis and RabbitMQ |
//! | [`replays`] | intended replays: the `bq-replay-bypass` header |
//! | [`redrive`] | dead-letter redrive: the redriven bytes, the rules, why nothing is lost, the CLI's `redrive` and `dlq` |
//! | [`outbox`] | the producer's side: publishing envelopes, the transactional outbox (its table, shared with the family), outgoing messages in a transactional handler, the relay, retention |
//! | [`observability`] | the consumer span's fields, the decision counters and the `metrics` names |
//!
//! The crates: `babel-idem` (this one: the guard, the stores, the router,
//! the consumer and its transports, each backend and transport behind its
//! cargo feature), `babel-idem-macros` (`#[idempotent]`, `urn!`, `routes!`,
//! re-exported here), `babel-idem-urn` (the URN validator the runtime and
//! the macros share) and `babel-idem-cli` (the operator CLI `babel-idem`,
//! which reads the layouts of [`stores`]). Adapters to other frameworks
//! live in [`adapters`](crate::adapters), each built on the guard alone.

pub mod modes {
    #![doc = include_str!("guide/modes.md")]
}

pub mod batches {
    #![doc = include_str!("guide/batches.md")]
}

pub mod stores {
    #![doc = include_str!("guide/stores.md")]
    #![doc = "```sql"]
    #![doc = include_str!("store/sqlite.sql")]
    #![doc = "```"]
    #![doc = include_str!("guide/stores-sqlite-claims.md")]
    #![doc = "```sql"]
    #![doc = include_str!("store/sqlite/claims.sql")]
    #![doc = "```"]
    #![doc = include_str!("guide/stores-postgres.md")]
    #![doc = "```sql"]
    #![doc = include_str!("store/postgres.sql")]
    #![doc = "```"]
    #![doc = include_str!("guide/stores-postgres-claims.md")]
    #![doc = "```sql"]
    #![doc = include_str!("store/postgres/claims.sql")]
    #![doc = "```"]
    #![doc = include_str!("guide/stores-redis.md")]
}

pub mod consumers {
    #![doc = include_str!("guide/consumers.md")]
}

pub mod replays {
    #![doc = include_str!("guide/replays.md")]
}

pub mod redrive {
    #![doc = include_str!("guide/redrive.md")]
}

pub mod outbox {
    #![doc = include_str!("guide/outbox.md")]
}

pub mod observability {
    #![doc = include_str!("guide/observability.md")]
}
