//! The connection [`RedisStore`](crate::store::RedisStore) and
//! `RedisTransport` speak through: one server (a reconnecting
//! `ConnectionManager`) or, with the `redis-cluster` feature, a Redis
//! Cluster (the `redis` crate's async cluster client, which follows `MOVED`
//! and `ASK` and refreshes its slot map by itself).

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::task::Poll;

use ::redis::aio::{ConnectionLike, ConnectionManager};
use ::redis::{Cmd, Pipeline, RedisFuture, Value};

#[cfg(feature = "redis-cluster")]
pub(crate) mod cluster;

/// One server or a cluster, behind the `redis` crate's `ConnectionLike`, so
/// a command or a pipeline is sent the same way to either. On a cluster a
/// command goes to the master of its first key's slot, and a pipeline to the
/// master of its first keyed command's slot: every key of one call must be
/// in one slot.
#[derive(Clone)]
pub(crate) enum Connection {
    Single(ConnectionManager),
    #[cfg(feature = "redis-cluster")]
    Cluster(
        ::redis::cluster_async::ClusterConnection,
        std::sync::Arc<cluster::SlotCache>,
    ),
}

impl Connection {
    /// A cluster connection, with a slot map of its own for batches.
    #[cfg(feature = "redis-cluster")]
    pub(crate) fn cluster(connection: ::redis::cluster_async::ClusterConnection) -> Self {
        Connection::Cluster(connection, std::sync::Arc::default())
    }

    /// Whether keys of different slots must go in different calls.
    pub(crate) fn is_cluster(&self) -> bool {
        match self {
            Connection::Single(_) => false,
            #[cfg(feature = "redis-cluster")]
            Connection::Cluster(..) => true,
        }
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(connection) => connection.req_packed_command(cmd),
            #[cfg(feature = "redis-cluster")]
            Connection::Cluster(connection, _) => connection.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Single(connection) => {
                connection.req_packed_commands(pipeline, offset, count)
            }
            #[cfg(feature = "redis-cluster")]
            Connection::Cluster(connection, _) => {
                connection.req_packed_commands(pipeline, offset, count)
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(connection) => connection.get_db(),
            #[cfg(feature = "redis-cluster")]
            Connection::Cluster(connection, _) => connection.get_db(),
        }
    }
}

/// Runs `futures` at once, on the caller's task; their outputs in order.
/// The calls of a batch that a cluster splits by slot go out together this
/// way, each master's share back to back on its one connection.
#[cfg_attr(not(feature = "redis-cluster"), allow(dead_code))]
pub(crate) async fn join_all<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut pending: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    let mut left = pending.len();
    poll_fn(move |cx| {
        for (future, output) in pending.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none()
                && let Poll::Ready(value) = future.as_mut().poll(cx)
            {
                *output = Some(value);
                left -= 1;
            }
        }
        if left == 0 {
            Poll::Ready(outputs.drain(..).flatten().collect())
        } else {
            Poll::Pending
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn join_all_answers_in_the_order_of_its_futures() {
        let delays = [30u64, 0, 10];
        let outputs = join_all(delays.iter().map(|&ms| async move {
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            ms
        }))
        .await;
        assert_eq!(outputs, delays);
        assert!(
            join_all(Vec::<std::future::Ready<u8>>::new())
                .await
                .is_empty()
        );
    }
}
