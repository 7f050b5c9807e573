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
//!
//! A page names an item behind a cargo feature through a link definition
//! given here: the item with the feature, the published docs without it,
//! so every page builds whatever the features.

pub mod modes {
    #![doc = include_str!("guide/modes.md")]
    #![cfg_attr(
        feature = "redis",
        doc = "",
        doc = "[wait_for_replicas]: crate::store::RedisStoreBuilder::wait_for_replicas"
    )]
    #![cfg_attr(
        not(feature = "redis"),
        doc = "",
        doc = "[wait_for_replicas]: https://docs.rs/babel-idem/latest/babel_idem/store/struct.RedisStoreBuilder.html#method.wait_for_replicas"
    )]
}

pub mod batches {
    #![doc = include_str!("guide/batches.md")]
    #![cfg_attr(
        feature = "consumer",
        doc = "",
        doc = "[Consumer]: crate::consumer::Consumer",
        doc = "[concurrency]: crate::consumer::ConsumerBuilder::concurrency",
        doc = "[batch_store_calls]: crate::consumer::ConsumerBuilder::batch_store_calls"
    )]
    #![cfg_attr(
        not(feature = "consumer"),
        doc = "",
        doc = "[Consumer]: https://docs.rs/babel-idem/latest/babel_idem/consumer/struct.Consumer.html",
        doc = "[concurrency]: https://docs.rs/babel-idem/latest/babel_idem/consumer/struct.ConsumerBuilder.html#method.concurrency",
        doc = "[batch_store_calls]: https://docs.rs/babel-idem/latest/babel_idem/consumer/struct.ConsumerBuilder.html#method.batch_store_calls"
    )]
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
    #![cfg_attr(
        feature = "consumer",
        doc = "",
        doc = "[batch_store_calls]: crate::consumer::ConsumerBuilder::batch_store_calls"
    )]
    #![cfg_attr(
        not(feature = "consumer"),
        doc = "",
        doc = "[batch_store_calls]: https://docs.rs/babel-idem/latest/babel_idem/consumer/struct.ConsumerBuilder.html#method.batch_store_calls"
    )]
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
