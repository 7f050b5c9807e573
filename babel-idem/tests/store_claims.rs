//! The claim section of the store contract (`store_contract::claim`),
//! run against every store that implements `ClaimStore`, with real Redis
//! and PostgreSQL (`BABEL_IDEM_REDIS_URL`, `BABEL_IDEM_POSTGRES_URL`).

#[macro_use]
mod store_contract;

mod memory {
    use crate::store_contract::MemoryBackend;
    claim_contract_tests!(MemoryBackend::create);
}

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

/// `RedisStore` in the PHP SDK's claim layout: the fenced checks do not
/// apply (it keeps no owner), the rest of the claim contract does, and the
/// keys are the PHP SDK's.
#[cfg(feature = "redis")]
mod redis_php {
    use std::time::Duration;

    use babel_idem::store::RedisStore;
    use babel_idem::store::{Claim, ClaimToken};
    use babel_idem::{ClaimStore, Store, StoreError};
    use redis::AsyncCommands;

    use crate::store_contract::claim::{self, SeenSetReader};
    use crate::store_contract::{Backend, RedisBackend};

    struct PhpBackend(RedisBackend);

    impl PhpBackend {
        fn create(test: &str) -> Option<Self> {
            RedisBackend::create(test).map(PhpBackend)
        }
    }

    impl Backend for PhpBackend {
        type Store = RedisStore;

        async fn build(
            &self,
            space: &str,
            ttl: Option<Duration>,
        ) -> Result<RedisStore, StoreError> {
            let mut builder = RedisStore::builder()
                .php_claims()
                .prefix(self.0.prefix(space));
            if let Some(ttl) = ttl {
                builder = builder.ttl(ttl);
            }
            builder.connect_lazy(&self.0.url)
        }

        fn self_expiring(&self) -> bool {
            true
        }
    }

    // The operator's view of the PHP layout: `'1'` is claimed, never done.
    admin_contract_tests!(PhpBackend::create);

    impl SeenSetReader for PhpBackend {
        /// The PHP SDK's `seen`: `GET <prefix><id> === '2'`.
        async fn reader_sees(&self, store: &RedisStore, id: &str) -> bool {
            let value: Option<String> = self.0.raw().await.get(store.key(id)).await.unwrap();
            value.as_deref() == Some("2")
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn exactly_one_of_64_concurrent_claims_wins() {
        if let Some(backend) = PhpBackend::create("php: exactly_one_of_64_concurrent_claims_wins") {
            claim::exactly_one_of_64_concurrent_claims_wins(&backend).await;
        }
    }

    #[tokio::test]
    async fn a_done_id_is_never_claimable_again() {
        if let Some(backend) = PhpBackend::create("php: a_done_id_is_never_claimable_again") {
            claim::a_done_id_is_never_claimable_again(&backend).await;
        }
    }

    #[tokio::test]
    async fn a_commit_retried_after_it_already_took_effect_answers_true() {
        if let Some(backend) =
            PhpBackend::create("php: a_commit_retried_after_it_already_took_effect_answers_true")
        {
            claim::a_commit_retried_after_it_already_took_effect_answers_true(&backend).await;
        }
    }

    #[tokio::test]
    async fn a_claim_never_looks_done_to_a_php_reader() {
        if let Some(backend) = PhpBackend::create("php: a_claim_never_looks_done_to_a_php_reader") {
            claim::a_claim_never_looks_done_to_a_seen_set_reader(&backend).await;
        }
    }

    #[tokio::test]
    async fn renewal_keeps_a_claim_past_its_first_lease() {
        if let Some(backend) = PhpBackend::create("php: renewal_keeps_a_claim_past_its_first_lease")
        {
            claim::renewal_keeps_a_claim_past_its_first_lease(&backend).await;
        }
    }

    /// The values are the PHP SDK's: `'1'` with the lease as a millisecond
    /// expiry while claimed, `'2'` once done; a PHP worker's claim and
    /// commit are honoured, and the Rust claim is unfenced (fence 0).
    #[tokio::test]
    async fn keys_and_values_are_the_php_sdks() {
        let Some(backend) = PhpBackend::create("php: keys_and_values_are_the_php_sdks") else {
            return;
        };
        let store = backend.open("php_keys", None).await;
        assert_eq!(
            RedisStore::builder()
                .php_claims()
                .connect_lazy(&backend.0.url)
                .unwrap()
                .prefix(),
            "bq:idem:"
        );
        let mut raw = backend.0.raw().await;
        let key = store.key("id-A");
        assert_eq!(store.claim_key("id-A"), key, "one key per id");

        let owner = ClaimToken::random();
        let lease = Duration::from_secs(30);
        assert_eq!(
            store.claim("id-A", owner, lease).await.unwrap(),
            Claim::Won { fence: 0 }
        );
        let value: Option<String> = raw.get(&key).await.unwrap();
        let pttl: i64 = raw.pttl(&key).await.unwrap();
        assert_eq!(value.as_deref(), Some("1"));
        assert!(pttl > 0 && pttl <= 30_000, "PX <lease ms>, got {pttl}");
        assert!(!store.seen("id-A").await.unwrap(), "a claim is not done");
        assert!(store.commit("id-A", owner).await.unwrap());
        let value: Option<String> = raw.get(&key).await.unwrap();
        let pttl: i64 = raw.pttl(&key).await.unwrap();
        assert_eq!(value.as_deref(), Some("2"));
        assert_eq!(pttl, -1, "done, with no TTL, as the PHP SDK writes it");
        assert!(
            store.commit("id-A", owner).await.unwrap(),
            "a retried commit finds the id done"
        );
        assert!(!store.release("id-A", owner).await.unwrap());
        let value: Option<String> = raw.get(&key).await.unwrap();
        assert_eq!(
            value.as_deref(),
            Some("2"),
            "release never deletes a done id"
        );

        // A PHP worker's claim (`SET key 1 PX NX`) parks a Rust delivery.
        let php_key = store.key("id-B");
        let _: () = redis::cmd("SET")
            .arg(&php_key)
            .arg("1")
            .arg("PX")
            .arg(30_000)
            .arg("NX")
            .query_async(&mut raw)
            .await
            .unwrap();
        match store
            .claim("id-B", ClaimToken::random(), lease)
            .await
            .unwrap()
        {
            Claim::Held { retry_after } => {
                assert!(retry_after.is_some_and(|left| left <= Duration::from_secs(30)))
            }
            other => panic!("expected held, got {other:?}"),
        }
        // The PHP worker commits (`SET key 2`): the id is done for Rust too.
        let _: () = raw.set(&php_key, "2").await.unwrap();
        assert!(store.seen("id-B").await.unwrap());
        assert_eq!(
            store
                .claim("id-B", ClaimToken::random(), lease)
                .await
                .unwrap(),
            Claim::Done
        );
        // Rust's remember writes the PHP done value.
        store.remember("id-C").await.unwrap();
        let value: Option<String> = raw.get(store.key("id-C")).await.unwrap();
        assert_eq!(value.as_deref(), Some("2"));
    }
}
