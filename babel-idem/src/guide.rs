//! How babel-idem decides, stores and settles, page by page: the reference
//! the API docs point to.
//!
//! | page | what it holds |
//! |---|---|
//! | [`modes`] | the three modes' decision tables: seen-set (the default), claim (lease, fence, release, park), transactional |
//! | [`batches`] | many messages per store round trip: the batch store calls, [`Guard::run_batch`](crate::guard::Guard::run_batch), [`Batched`](crate::store::Batched) |
//! | [`stores`] | every backend's layout on one page: the in-memory store, the SQLite and PostgreSQL tables (their DDL), the Redis keys (the Go and PHP layouts) and the roles of its Lua scripts |
//! | [`consumers`] | from a raw delivery to a [`Disposition`](crate::router::Disposition), and how the consumer settles each one on Redis, RabbitMQ and Kafka |
//! | [`retention`] | how long marks are kept: longer than the longest gap between two deliveries of one id, what an early expiry costs, storage per mark, each backend's expiry |
//! | [`replays`] | intended replays: the `bq-replay-bypass` header |
//! | [`redrive`] | dead-letter redrive: the redriven bytes, the rules, why nothing is lost, the CLI's `redrive` and `dlq` |
//! | [`outbox`] | the producer's side: publishing envelopes, the transactional outbox (its table, shared with the family), outgoing messages in a transactional handler, the relay, retention |
//! | [`observability`] | the consumer span's fields, the decision counters and the `metrics` names |
//! | [`typed`] | message types: typed handlers and `routes!`, `#[idempotent]` on them, typed publishing and the queue it goes to, payload schemas (in code, `registry.json`, exported from a type), what becomes of an invalid payload |
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

/// One page of the guide: the module `$name` whose docs are `$file`. Links
/// to items behind a `$feature` are defined once for both builds: the item
/// with the feature, its published docs (`$url`) without it.
macro_rules! page {
    ($name:ident, $file:literal $(, $feature:literal => [$($label:literal: $item:literal, $url:literal),+ $(,)?])* $(,)?) => {
        pub mod $name {
            #![doc = include_str!($file)]
            $(
                #![cfg_attr(feature = $feature, doc = "", $(doc = concat!("[", $label, "]: ", $item)),+)]
                #![cfg_attr(not(feature = $feature), doc = "", $(doc = concat!("[", $label, "]: ", $url)),+)]
            )*
        }
    };
}

page!(modes, "guide/modes.md", "redis" => [
    "wait_for_replicas": "crate::store::RedisStoreBuilder::wait_for_replicas",
    "https://docs.rs/babel-idem/latest/babel_idem/store/struct.RedisStoreBuilder.html#method.wait_for_replicas",
]);

page!(batches, "guide/batches.md", "consumer" => [
    "Consumer": "crate::consumer::Consumer",
    "https://docs.rs/babel-idem/latest/babel_idem/consumer/struct.Consumer.html",
    "concurrency": "crate::consumer::ConsumerBuilder::concurrency",
    "https://docs.rs/babel-idem/latest/babel_idem/consumer/struct.ConsumerBuilder.html#method.concurrency",
    "batch_store_calls": "crate::consumer::ConsumerBuilder::batch_store_calls",
    "https://docs.rs/babel-idem/latest/babel_idem/consumer/struct.ConsumerBuilder.html#method.batch_store_calls",
]);

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

page!(consumers, "guide/consumers.md", "consumer" => [
    "batch_store_calls": "crate::consumer::ConsumerBuilder::batch_store_calls",
    "https://docs.rs/babel-idem/latest/babel_idem/consumer/struct.ConsumerBuilder.html#method.batch_store_calls",
]);

page!(retention, "guide/retention.md");

page!(replays, "guide/replays.md");

page!(redrive, "guide/redrive.md");

page!(outbox, "guide/outbox.md");

page!(observability, "guide/observability.md");

page!(typed, "guide/typed.md",
    "schema" => [
        "schema module": "crate::schema",
        "https://docs.rs/babel-idem/latest/babel_idem/schema/index.html",
        "Schemas": "crate::schema::Schemas",
        "https://docs.rs/babel-idem/latest/babel_idem/schema/struct.Schemas.html",
        "Registry": "crate::schema::Registry",
        "https://docs.rs/babel-idem/latest/babel_idem/schema/struct.Registry.html",
        "check_schema": "crate::Envelope::check_schema",
        "https://docs.rs/babel-idem/latest/babel_idem/envelope/struct.Envelope.html#method.check_schema",
        "write_registry": "crate::schema::Schemas::write_registry",
        "https://docs.rs/babel-idem/latest/babel_idem/schema/struct.Schemas.html#method.write_registry",
    ],
    "schemars" => [
        "Schema::of": "crate::schema::Schema::of",
        "https://docs.rs/babel-idem/latest/babel_idem/schema/struct.Schema.html#method.of",
        "with_message": "crate::schema::Schemas::with_message",
        "https://docs.rs/babel-idem/latest/babel_idem/schema/struct.Schemas.html#method.with_message",
    ],
);
