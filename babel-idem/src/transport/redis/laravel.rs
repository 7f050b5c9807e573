//! The Laravel-compatible layout of [`RedisTransport`]: Laravel's stock
//! Redis queue, as the Python SDK's `RedisTransport(laravel_compat=True)`
//! (URL `?laravel=1`) reads and writes it. Selected by the URL
//! (`?laravel=1`, `?laravel_compat=1`, optional `&prefix=`) or by
//! [`laravel_layout`](super::RedisTransportBuilder::laravel_layout).
//!
//! | key | type | holds |
//! |---|---|---|
//! | `<prefix><queue>` | list | ready jobs; the prefix is `queues:` unless set |
//! | `<prefix><queue>:reserved` | sorted set | one member per reservation: the job with `attempts` advanced by one (cjson's encoding), or the job itself when the pop could not decode it; scored by its deadline (whole Unix seconds, or `+inf`) |
//! | `<prefix><queue>:delayed` | sorted set | jobs waiting for their time, scored by when they are due (whole Unix seconds) |
//! | `<prefix><queue>:notify` | list | one wake-up token (`1`) per job made ready |
//! | `<prefix><queue>.dlq` | list | dead-letter records (the consumer names the queue; its `:notify` gets a token each) |
//!
//! | operation | script | what it does |
//! |---|---|---|
//! | publish | `laravel_push.lua` | `RPUSH` the job to the ready list, `RPUSH` a token to `:notify` |
//! | publish later | `laravel_delay.lua` | `ZADD` the job to `:delayed`, due the server's whole seconds now plus the delay rounded up |
//! | reserve | `laravel_reserve.lua` | migrate the due `:delayed` members, then (unless reservations never lapse) the lapsed `:reserved` ones, to the end of the ready list with a token each; then Laravel's pop once a job, with the Python SDK's `pcall` guard |
//! | ack | `laravel_settle.lua` | `ZREM` the member |
//! | release (a retry, a hand-back) | `laravel_settle.lua` | `ZREM` the member, `ZADD` the body to `:delayed`, due now |
//! | dead-letter | `laravel_settle.lua` | `ZREM` the member, `RPUSH` the record to the dead-letter list and a token to its `:notify` |
//! | extend | `laravel_extend.lua` | move the member's score to the server's now plus `retry_after`, never earlier |
//! | sweep | `laravel_migrate.lua` | the reserve's migrations alone |
//!
//! Every script is `keys.lua` and `laravel_keys.lua` (the type checks, the
//! migration) before its own text, checks every key's type before it
//! writes, and reads the server's clock (`TIME`). Settles and extends are
//! gated on the reserved member, as the Python SDK's dead-letter is: once a
//! migration has taken a reservation back, a late settle touches nothing.
//! What is stored is what the Python SDK stores, byte for byte: the same
//! keys, members, tokens and scores in whole seconds (by the server's
//! clock, where the Python SDK reads its own; a reservation's deadline is
//! rounded up, so it lasts at least `retry_after`).
//!
//! A member is the job's bytes (attempts advanced), so two identical jobs
//! reserved at once share one member, as in Laravel: the first settle
//! removes it, and the second finds its reservation gone.

use std::sync::Arc;
use std::time::Duration;

use ::redis::{Cmd, RedisError, Script, ScriptInvocation};

use super::{RedisHandle, RedisTransport, Scripts, broker, whole_seconds_up};
use crate::broker::{Reserved, Settlement, TransportError};
use crate::transport::binding::QueueNames;

/// The ready lists' prefix when none is set: Laravel's.
pub(super) const DEFAULT_PREFIX: &str = "queues:";

/// The suffixes of the layout's own keys beside a queue's ready list.
const OWN_SUFFIXES: [&str; 3] = [":reserved", ":delayed", ":notify"];

/// The queue names the layout can hold: the legacy layout's rules, with
/// this layout's own suffixes in place of the legacy ones.
pub(super) const QUEUE_NAMES: QueueNames = QueueNames {
    own_rule: |queue| {
        OWN_SUFFIXES
            .iter()
            .any(|suffix| queue.ends_with(suffix))
            .then_some(
                "a queue name cannot end in :reserved, :delayed or :notify, the Laravel layout's \
                 own keys",
            )
    },
    ..super::QUEUE_NAMES
};

/// The source of one of the layout's scripts, `redis/<file>`, behind
/// `redis/keys.lua` and `redis/laravel_keys.lua`.
macro_rules! laravel_source {
    ($file:literal) => {
        concat!(
            include_str!("keys.lua"),
            include_str!("laravel_keys.lua"),
            include_str!($file)
        )
    };
}

/// One of the layout's scripts, `redis/<file>`.
macro_rules! laravel_script {
    ($file:literal) => {
        Script::new(laravel_source!($file))
    };
}

/// The Laravel layout of one transport: its prefix and the scripts that only
/// it runs.
pub(super) struct Laravel {
    prefix: String,
    push: Script,
    delay: Script,
}

impl Laravel {
    pub(super) fn new(prefix: String) -> Self {
        Laravel {
            prefix,
            push: laravel_script!("laravel_push.lua"),
            delay: laravel_script!("laravel_delay.lua"),
        }
    }

    /// The scripts a [`RedisTransport`] reserves, sweeps, settles and
    /// extends with, in this layout.
    pub(super) fn scripts() -> Scripts {
        Scripts {
            reserve: laravel_script!("laravel_reserve.lua"),
            sweep: laravel_script!("laravel_migrate.lua"),
            settle: laravel_script!("laravel_settle.lua"),
            extend: laravel_script!("laravel_extend.lua"),
        }
    }

    /// The ready list of `queue`: `<prefix><queue>`.
    pub(super) fn ready(&self, queue: &str) -> String {
        format!("{}{queue}", self.prefix)
    }

    fn key(&self, queue: &str, suffix: &str) -> String {
        format!("{}{queue}{suffix}", self.prefix)
    }

    /// The `:notify` list of `queue`.
    pub(super) fn notify(&self, queue: &str) -> String {
        self.key(queue, ":notify")
    }

    /// The keys of `queue` every reserve and migration touches: ready,
    /// `:reserved`, `:delayed`, `:notify`.
    fn queue_keys(&self, queue: &str) -> [String; 4] {
        [
            self.ready(queue),
            self.key(queue, ":reserved"),
            self.key(queue, ":delayed"),
            self.notify(queue),
        ]
    }

    /// The push script as a command, for a pipeline: it carries the script's
    /// text, so a server that has not loaded it runs it all the same.
    pub(super) fn push_command(&self, queue: &str, body: &[u8]) -> Cmd {
        let mut command = ::redis::cmd("EVAL");
        command
            .arg(laravel_source!("laravel_push.lua"))
            .arg(2)
            .arg(self.ready(queue))
            .arg(self.notify(queue))
            .arg(body);
        command
    }
}

impl std::fmt::Debug for Laravel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Laravel")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// The prefix a `prefix=` URL value names, percent-decoded (`+` is a space)
/// as the Python SDK's `parse_qs` reads it; an empty one keeps the default.
pub(super) fn url_prefix(value: &str) -> Option<String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |at: usize| {
            bytes
                .get(at)
                .and_then(|&b| char::from(b).to_digit(16))
                .and_then(|d| u8::try_from(d).ok())
        };
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if hex(i + 1).is_some() && hex(i + 2).is_some() => {
                out.push(hex(i + 1).unwrap_or(0) * 16 + hex(i + 2).unwrap_or(0));
                i += 2;
            }
            byte => out.push(byte),
        }
        i += 1;
    }
    let prefix = String::from_utf8_lossy(&out).into_owned();
    (!prefix.is_empty()).then_some(prefix)
}

impl RedisTransport {
    /// Publishes `body` to `queue` so that no worker reserves it before
    /// `delay` has passed: in the Laravel-compatible layout it joins
    /// `<prefix><queue>:delayed`, due the Redis server's whole seconds now
    /// plus `delay` rounded up to the second (no wake-up token: the
    /// migration before each reserve makes it ready once due), as the
    /// Python SDK's `publish_delayed` stores it. A body already waiting
    /// there is not stored twice: its due time moves.
    ///
    /// The legacy layout has no delayed set: there it publishes nothing and
    /// fails with [`TransportError::Unsupported`], as the Python SDK raises.
    ///
    /// ```no_run
    /// use babel_idem::Envelope;
    /// use babel_idem::transport::RedisTransport;
    /// use serde_json::json;
    /// use std::time::Duration;
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let transport = RedisTransport::connect("redis://127.0.0.1:6379/0?laravel=1").await?;
    /// let reminder = Envelope::new("urn:babel:orders:remind", json!({"order": 7}));
    /// // In queues:orders:delayed, ready for a worker in 30 s.
    /// transport
    ///     .publish_delayed("orders", &reminder.encode_for_publish()?, Duration::from_secs(30))
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn publish_delayed(
        &self,
        queue: &str,
        body: &[u8],
        delay: Duration,
    ) -> Result<(), TransportError> {
        let Some(laravel) = &self.laravel else {
            return Err(TransportError::Unsupported {
                operation: "publish_delayed on the legacy Redis layout, which has no delayed set: \
                            it needs the Laravel-compatible layout (?laravel=1, or \
                            RedisTransportBuilder::laravel_layout)",
            });
        };
        crate::broker::Transport::check_queue(self, queue)?;
        let mut invocation = laravel.delay.key(laravel.key(queue, ":delayed"));
        invocation.arg(body).arg(whole_seconds_up(delay));
        self.invoke(&invocation).await?;
        Ok(())
    }

    /// Runs one of the layout's scripts: its answer, a count.
    async fn invoke(&self, invocation: &ScriptInvocation<'_>) -> Result<u64, TransportError> {
        let mut connection = self.connection.clone();
        invocation
            .invoke_async(&mut connection)
            .await
            .map_err(broker)
    }

    /// Laravel's push of `body` to `queue`: the job and a wake-up token.
    pub(super) async fn push_laravel(
        &self,
        laravel: &Laravel,
        queue: &str,
        body: &[u8],
    ) -> Result<(), TransportError> {
        let mut invocation = laravel.push.key(laravel.ready(queue));
        invocation.key(laravel.notify(queue)).arg(body);
        self.invoke(&invocation).await?;
        Ok(())
    }

    /// The migrations of `queue` alone: how many jobs moved.
    pub(super) async fn migrate_laravel(
        &self,
        laravel: &Laravel,
        queue: &str,
    ) -> Result<u64, TransportError> {
        let mut invocation = self.scripts.sweep.prepare_invoke();
        for key in laravel.queue_keys(queue) {
            invocation.key(key);
        }
        invocation.arg(self.lifetime_argument()).arg(-1);
        self.invoke(&invocation).await
    }

    /// Migrates, then reserves up to `max` jobs of `queue` in one script. A
    /// job the pop reserved undecoded (its member is the job itself) is
    /// handed out as [`Reserved::poison`], for the consumer to dead-letter.
    pub(super) async fn reserve_laravel(
        &self,
        laravel: &Laravel,
        queue: &str,
        max: usize,
    ) -> Result<Vec<Reserved<RedisHandle>>, RedisError> {
        let mut invocation = self.scripts.reserve.prepare_invoke();
        for key in laravel.queue_keys(queue) {
            invocation.key(key);
        }
        invocation.arg(self.lifetime_argument()).arg(-1).arg(max);
        // A server that has forgotten the script (restarted) is sent it
        // again: it did not run, so asking again is safe.
        let mut connection = self.connection.clone();
        let pairs: Vec<Vec<u8>> = invocation.invoke_async(&mut connection).await?;
        let queue: Arc<str> = Arc::from(queue);
        let mut pairs = pairs.into_iter();
        let mut reserved = Vec::with_capacity(pairs.len() / 2);
        while let (Some(job), Some(member)) = (pairs.next(), pairs.next()) {
            reserved.push(Reserved {
                poison: job == member,
                body: job,
                headers: Vec::new(),
                attempts: None,
                handle: RedisHandle {
                    queue: Arc::clone(&queue),
                    raw: member,
                    token: String::new(),
                    headers: Vec::new(),
                },
            });
        }
        Ok(reserved)
    }

    /// The settle script as an `EVALSHA` for one reservation: `:reserved`
    /// alone for an ack, with `:delayed` for a release, with the dead-letter
    /// queue's ready and `:notify` lists for a dead-letter record.
    pub(super) fn settle_command_laravel(
        &self,
        laravel: &Laravel,
        handle: &RedisHandle,
        settlement: &Settlement,
    ) -> Cmd {
        let queue = &*handle.queue;
        let mut command = ::redis::cmd("EVALSHA");
        command.arg(self.scripts.settle.get_hash());
        let reserved = laravel.key(queue, ":reserved");
        match settlement {
            Settlement::Ack => command.arg(1).arg(reserved).arg(&handle.raw),
            Settlement::Requeue(body) => command
                .arg(2)
                .arg(reserved)
                .arg(laravel.key(queue, ":delayed"))
                .arg(&handle.raw)
                .arg(body),
            Settlement::DeadLetter { queue: dlq, body } => command
                .arg(3)
                .arg(reserved)
                .arg(laravel.ready(dlq))
                .arg(laravel.notify(dlq))
                .arg(&handle.raw)
                .arg(body),
        };
        command
    }

    /// Moves a reservation's score `retry_after` past the server's now.
    pub(super) async fn extend_laravel(
        &self,
        laravel: &Laravel,
        handle: &RedisHandle,
        retry_after: Duration,
    ) -> Result<bool, TransportError> {
        let mut connection = self.connection.clone();
        let extended: i64 = self
            .scripts
            .extend
            .key(laravel.key(&handle.queue, ":reserved"))
            .arg(&handle.raw)
            .arg(whole_seconds_up(retry_after))
            .invoke_async(&mut connection)
            .await
            .map_err(broker)?;
        Ok(extended == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_names_ending_in_the_layouts_own_keys_are_refused() {
        for bad in ["q:reserved", "q:delayed", "q:notify", "", "has space"] {
            assert!(QUEUE_NAMES.check(bad).is_err(), "{bad:?}");
        }
        for good in ["orders", "q:processing", "emails.dlq", "{orders}"] {
            QUEUE_NAMES.check(good).unwrap();
        }
    }

    #[test]
    fn a_url_prefix_is_read_as_pythons_parse_qs_reads_it() {
        assert_eq!(url_prefix("queues:").as_deref(), Some("queues:"));
        assert_eq!(url_prefix("app%3Aq%3a").as_deref(), Some("app:q:"));
        assert_eq!(url_prefix("a+b").as_deref(), Some("a b"));
        assert_eq!(url_prefix("50%").as_deref(), Some("50%"));
        assert_eq!(url_prefix(""), None);
    }

    #[test]
    fn the_layouts_keys_follow_laravel() {
        let laravel = Laravel::new(DEFAULT_PREFIX.to_owned());
        assert_eq!(
            laravel.queue_keys("orders"),
            [
                "queues:orders",
                "queues:orders:reserved",
                "queues:orders:delayed",
                "queues:orders:notify"
            ]
        );
        assert_eq!(laravel.ready("orders.dlq"), "queues:orders.dlq");
    }
}
