//! [`RedisStore`] on a Redis Cluster (feature `redis-cluster`): building it
//! from a `redis+cluster://` URL, and the keys that differ from one
//! server's so that every script's keys share a slot. The layout is on
//! [`guide::stores`](crate::guide::stores).

use ::redis::cluster_async::ClusterConnection;

use super::{RedisOpenError, RedisStore, RedisStoreBuilder, open_failed};
use crate::redis_client::Connection;
use crate::redis_client::cluster::{self as client, slot, slot_tag};
use crate::store::StoreError;

impl RedisStoreBuilder {
    /// A store over a cluster connection the caller already has (cloned per
    /// call, never closed by the store; its settings apply). Must be called
    /// inside a Tokio runtime with timers and I/O.
    ///
    /// ```no_run
    /// use babel_idem::store::RedisStore;
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = redis::cluster::ClusterClient::new(vec!["redis://10.0.0.1:7000/"])?;
    /// let connection = client.get_async_connection().await?;
    /// let store = RedisStore::builder().from_cluster_connection(connection)?;
    /// assert!(store.is_cluster());
    /// # Ok(())
    /// # }
    /// ```
    pub fn from_cluster_connection(
        self,
        connection: ClusterConnection,
    ) -> Result<RedisStore, StoreError> {
        Ok(self
            .checked_for_cluster()?
            .with(Connection::cluster(connection)))
    }

    pub(super) fn cluster_lazy(
        self,
        url: &str,
        _reason: &'static str,
    ) -> Result<RedisStore, StoreError> {
        let settings = self.checked_for_cluster()?;
        settings.on_cluster(client::connect_lazy(
            url,
            self.timeout,
            self.reconnect_attempts,
        ))
    }

    pub(super) async fn cluster_eager(
        self,
        url: &str,
        _reason: &'static str,
    ) -> Result<RedisStore, StoreError> {
        let settings = self.checked_for_cluster()?;
        settings.on_cluster(client::connect(url, self.timeout, self.reconnect_attempts).await)
    }

    /// [`checked`](Self::checked), and a prefix with no `{` or `}`: the
    /// store's hash tags must be the only ones in its keys.
    fn checked_for_cluster(&self) -> Result<super::RedisSettings, StoreError> {
        if self.prefix.contains(['{', '}']) {
            return Err(open_failed(RedisOpenError::ClusterPrefix(
                self.prefix.clone(),
            )));
        }
        self.checked()
    }
}

impl super::RedisSettings {
    /// The store over `connection`, the cluster connection just opened, or
    /// the open failure it is.
    fn on_cluster(
        self,
        connection: Result<ClusterConnection, client::ClusterOpenError>,
    ) -> Result<RedisStore, StoreError> {
        let connection = connection.map_err(|e| open_failed(RedisOpenError::ClusterOpen(e)))?;
        Ok(self.with(Connection::cluster(connection)))
    }
}

/// The claim key of `id` on a cluster, in the slot of its done key
/// `<prefix><id>`: `<claim prefix>{<prefix><id>}` (the done key whole as the
/// hash tag) for an id with no `{` or `}`; for one with either, whose done
/// key may carry a hash tag of its own, `<claim prefix>{<slot tag>}<id>`,
/// the slot tag being a short tag of the done key's slot. The two forms
/// never meet: the first ends with its only `}`, the second holds the id's
/// brace after the tag's.
pub(super) fn claim_key(claim_prefix: &[u8], prefix: &str, id: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(claim_prefix.len() + prefix.len() + id.len() + 8);
    key.extend_from_slice(claim_prefix);
    key.push(b'{');
    if id.contains(['{', '}']) {
        let done = [prefix.as_bytes(), id.as_bytes()].concat();
        key.extend_from_slice(slot_tag(slot(&done)).as_bytes());
        key.push(b'}');
        key.extend_from_slice(id.as_bytes());
    } else {
        key.extend_from_slice(prefix.as_bytes());
        key.extend_from_slice(id.as_bytes());
        key.push(b'}');
    }
    key
}

/// The fence counter of the slot `done_key` is in: `<fence>{<slot tag>}`.
pub(super) fn fence_key(fence: &[u8], done_key: &[u8]) -> Vec<u8> {
    let tag = slot_tag(slot(done_key));
    let mut key = Vec::with_capacity(fence.len() + tag.len() + 2);
    key.extend_from_slice(fence);
    key.push(b'{');
    key.extend_from_slice(tag.as_bytes());
    key.push(b'}');
    key
}

/// The indices of `keys` grouped by slot, groups in the order of their
/// first key, indices in order within a group.
pub(super) fn slot_groups<K: AsRef<[u8]>>(keys: &[K]) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut group_of = hashbrown::HashMap::<u16, usize, _>::with_capacity_and_hasher(
        keys.len(),
        foldhash::fast::RandomState::default(),
    );
    for (i, key) in keys.iter().enumerate() {
        let group = *group_of.entry(slot(key.as_ref())).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[group].push(i);
    }
    groups
}

impl RedisStore {
    /// Every master that serves slots now, as `(host, port)`; empty on one
    /// server.
    pub(super) async fn cluster_masters(
        &self,
    ) -> Result<Option<(ClusterConnection, Vec<(String, u16)>)>, ::redis::RedisError> {
        let Connection::Cluster(connection, _) = &self.connection else {
            return Ok(None);
        };
        let mut connection = connection.clone();
        let masters = client::masters(&mut connection).await?;
        Ok(Some((connection, masters)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_keys_share_the_slot_of_their_done_key_whatever_the_id() {
        let ids = [
            "order-42",
            "a{b}c",
            "{}",
            "}{",
            "{x",
            "x}",
            "{{x}}",
            "{bq:idemp:y}",
            "é{ü}",
        ];
        let mut keys = std::collections::HashSet::new();
        for id in ids {
            let done = [b"bq:idemp:".as_slice(), id.as_bytes()].concat();
            let claim = claim_key(b"bq:idemp-claim:", "bq:idemp:", id);
            assert_eq!(slot(&claim), slot(&done), "{id:?}");
            assert_eq!(
                slot(&fence_key(b"bq:idemp-fence", &done)),
                slot(&done),
                "{id:?}"
            );
            assert!(keys.insert(claim), "{id:?}: two ids, one claim key");
        }
        assert_eq!(
            claim_key(b"bq:idemp-claim:", "bq:idemp:", "order-42"),
            b"bq:idemp-claim:{bq:idemp:order-42}"
        );
    }

    #[test]
    fn slot_groups_keep_first_seen_order() {
        let keys = [b"{a}1".as_slice(), b"{b}1", b"{a}2", b"{b}2", b"{c}"];
        assert_eq!(slot_groups(&keys), vec![vec![0, 2], vec![1, 3], vec![4]]);
    }
}
