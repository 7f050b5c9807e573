//! [`RedisTransport`]: the BabelQueue Redis binding (feature
//! `redis-transport`), legacy layout or Laravel-compatible layout,
//! byte-compatible with the Python SDK's `babelqueue.redis_transport` (1.24).

mod dlq;
pub(crate) mod frame;
mod laravel;
mod publish;
mod token;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{Client, Cmd, RedisError, RedisResult, Script};

use self::laravel::Laravel;
use self::token::Tokens;
use crate::coalesce::Coalescer;
use crate::redis_client::Connection;

use super::TransportBuilder;
use super::binding::QueueNames;
use crate::broker::{Reserved, Settlement, Transport};
use crate::broker::{TransportError, TransportFuture};

/// How long a reservation lasts before the sweep takes it back: the Python
/// SDK's default (`retry_after`, 90 s).
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(90);

const PROCESSING_SUFFIX: &str = ":processing";
const DEADLINES_SUFFIX: &str = ":processing:deadlines";

/// The queue names the layout can hold: at most 512 bytes (the layout
/// appends suffixes to it), no whitespace or control characters, and none
/// ending in the layout's own suffixes, whose keys it would collide with.
const QUEUE_NAMES: QueueNames = QueueNames {
    max_len: 512,
    too_long: "a queue name is at most 512 bytes",
    refused: |c| c.is_whitespace() || c.is_control(),
    refused_reason: "a queue name cannot hold whitespace or control characters",
    own_rule: |queue| {
        (queue.ends_with(PROCESSING_SUFFIX) || queue.ends_with(DEADLINES_SUFFIX)).then_some(
            "a queue name cannot end in :processing or :processing:deadlines, the layout's own keys",
        )
    },
};

/// The BabelQueue Redis binding, legacy layout, shared with the Python (and
/// PHP, Go) SDKs' workers and producers on the same queue:
///
/// | key | type | holds |
/// |---|---|---|
/// | `<queue>` | list | ready deliveries; producers `RPUSH` |
/// | `<queue>:processing` | list | reserved deliveries, raw values |
/// | `<queue>:processing:deadlines` | sorted set | one member `<token>:<raw>` per reservation, scored by its deadline (whole Unix seconds, by the server's clock) |
/// | `<queue>.dlq` | list | dead-letter records (the consumer names it) |
///
/// - Reserve (one script, one round trip for a whole batch) first sweeps,
///   then moves up to `max` values from the head of `<queue>` to
///   `<queue>:processing` and adds a deadline member for each, with a fresh
///   32-hex-character token.
/// - The sweep returns reservations whose deadline lapsed to the *end* of
///   `<queue>`, unchanged: a worker killed with deliveries in flight loses
///   none of them, and recovery is not counted as an attempt.
/// - Deadlines are written and swept by the Redis server's clock (`TIME`
///   inside the scripts), never a worker's: a worker whose clock runs ahead
///   cannot take the others' reservations back early.
/// - Settle (ack, requeue, dead-letter) is one script gated on the
///   reservation's own deadline member, so a late settle of a reservation
///   the sweep took back touches nothing. A settle that fails (a key of the
///   wrong type, say) changes nothing and is an error
///   ([`TransportError::Broker`]): the reservation stays as it was.
/// - Extend (the consumer keeps a reservation alive while its handler runs
///   and while it waits a backoff or a delay) is one script gated the same
///   way: it moves the member's score to the server's `TIME` plus
///   `retry_after`, never earlier.
/// - A value stored with headers is a `__bq_frame` frame
///   ([`publish_with_headers`](Self::publish_with_headers)); a requeue or a
///   dead-letter record keeps the delivery's headers, framed the same way.
///
/// The Laravel-compatible layout (Laravel's stock Redis queue, the Python
/// SDK's `laravel_compat=True`) is chosen by the URL (`?laravel=1`, with an
/// optional `&prefix=`) or by
/// [`laravel_layout`](TransportBuilder::laravel_layout): `queues:<queue>`,
/// its `:reserved` and `:delayed` sorted sets and its `:notify` list, the
/// Laravel scripts, and [`publish_delayed`](Self::publish_delayed). Its
/// keys and scripts are on one page, the `laravel` module's source
/// (`src/transport/redis/laravel.rs`). In it, headers are not stored (the
/// pop decodes the stored job, so no frame can ride there): they are
/// dropped, as the Python SDK drops them, and a job the pop cannot decode
/// is handed out as [`Reserved::poison`](crate::broker::Reserved::poison).
///
/// # Redis Cluster
///
/// With the `redis-cluster` feature, a `redis+cluster://host:port[,host:port...]`
/// URL (`rediss+cluster://` for TLS, `user:password@` for an ACL user)
/// connects to a Redis Cluster. A queue's scripts touch `<queue>`,
/// `<queue>:processing` and `<queue>:processing:deadlines` at once, so on a
/// cluster a queue name must carry a hash tag (`{orders}`, `jobs:{orders}`):
/// every key of its layout, `<queue>.dlq` included, then shares the tag's
/// slot. A name without one is refused ([`TransportError::InvalidQueue`]),
/// and so is a dead-letter queue in another slot when a delivery is
/// dead-lettered (name it after the queue's tag). A Python SDK worker or
/// producer on the same queue uses the same name with a
/// `redis.cluster.RedisCluster` client: its scripts touch the same keys.
/// Settles of different queues go in one pipeline per queue, at once.
///
/// ```no_run
/// use babel_idem::transport::RedisTransport;
/// use std::time::Duration;
///
/// # async fn run() -> Result<(), babel_idem::transport::TransportError> {
/// let transport = RedisTransport::builder()
///     .retry_after(Duration::from_secs(30))
///     .connect("redis://127.0.0.1:6379/0")
///     .await?;
/// transport.publish("orders", br#"{"job": "urn:babel:orders:created"}"#).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisTransport {
    connection: Connection,
    retry_after: Option<Duration>,
    /// The Laravel-compatible layout, or `None` for the legacy layout.
    laravel: Option<Arc<Laravel>>,
    /// The layout's scripts.
    scripts: Arc<Scripts>,
    tokens: Arc<Tokens>,
    /// Settles that meet go out in one pipeline, each with its own outcome.
    settles: Arc<Coalescer<Cmd, RedisResult<bool>>>,
}

struct Scripts {
    reserve: Script,
    sweep: Script,
    settle: Script,
    extend: Script,
}

/// One of the layout's scripts, `redis/<file>`, behind `redis/keys.lua`: the
/// sweep and the type checks every script makes before it writes anything.
macro_rules! layout_script {
    ($file:literal) => {
        Script::new(concat!(
            include_str!("redis/keys.lua"),
            include_str!(concat!("redis/", $file))
        ))
    };
}

/// Configures a [`RedisTransport`]; made by [`RedisTransport::builder`]. The
/// settings every binding shares are [`TransportBuilder`]'s; the Redis
/// binding's own are [`retry_after`](TransportBuilder::retry_after),
/// [`no_recovery`](TransportBuilder::no_recovery),
/// [`laravel_layout`](TransportBuilder::laravel_layout) and
/// [`key_prefix`](TransportBuilder::key_prefix).
pub type RedisTransportBuilder = TransportBuilder<RedisOptions>;

/// The Redis binding's own settings in a [`RedisTransportBuilder`], set by
/// its [`retry_after`](TransportBuilder::retry_after),
/// [`no_recovery`](TransportBuilder::no_recovery),
/// [`laravel_layout`](TransportBuilder::laravel_layout) and
/// [`key_prefix`](TransportBuilder::key_prefix).
#[derive(Debug, Clone)]
pub struct RedisOptions {
    retry_after: Option<Duration>,
    laravel: bool,
    prefix: String,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            retry_after: Some(DEFAULT_RETRY_AFTER),
            laravel: false,
            prefix: laravel::DEFAULT_PREFIX.to_owned(),
        }
    }
}

/// What a URL asks for once its query is split off.
#[derive(Debug)]
struct ParsedUrl<'u> {
    address: &'u str,
    retry_after: Option<Duration>,
    /// The Laravel layout's prefix, when the layout is asked for.
    laravel: Option<String>,
}

/// What [`RedisTransport`] needs to settle one reservation: the queue, the
/// raw stored value and the reservation's token (in the Laravel layout, the
/// reserved member alone).
#[derive(Debug, Clone)]
pub struct RedisHandle {
    queue: Arc<str>,
    raw: Vec<u8>,
    token: String,
    headers: Vec<(String, String)>,
}

impl RedisHandle {
    /// The reservation's token: 32 lowercase hexadecimal characters; empty
    /// in the Laravel layout, whose reserved member is the reservation.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The value as stored in the queue (a frame, when headers came with
    /// it); in the Laravel layout, the member in `:reserved` (the job with
    /// `attempts` advanced, or the job itself when the pop could not decode
    /// it).
    pub fn raw(&self) -> &[u8] {
        &self.raw
    }
}

impl TransportBuilder<RedisOptions> {
    /// How long a reservation lasts at least before the sweep returns it to
    /// the queue (default 90 s). Deadlines are whole seconds of the Redis
    /// server's clock, rounded up, so it may last less than two seconds
    /// longer, never shorter. It is how soon a crashed worker's deliveries
    /// come back. A [`Consumer`](crate::Consumer) extends each reservation
    /// it holds every third of it, so its handlers may run longer (its
    /// default per-delivery timeout does not follow this); a worker that
    /// does not extend (another SDK's) must keep it above its longest
    /// handler run, as a reservation that lapses is delivered again.
    pub fn retry_after(self, retry_after: Duration) -> Self {
        self.with_options(|options| options.retry_after = Some(retry_after))
    }

    /// Reservations never lapse (deadline `+inf`, the Python SDK's
    /// `retry_after=None`): a crashed worker's deliveries stay in
    /// `:processing` until an operator moves them.
    pub fn no_recovery(self) -> Self {
        self.with_options(|options| options.retry_after = None)
    }

    /// The Laravel-compatible layout (the Python SDK's `laravel_compat=True`,
    /// the URL's `?laravel=1`): `<prefix><queue>` ready lists, `:reserved`
    /// and `:delayed` sorted sets, `:notify` lists, Laravel's scripts, and
    /// [`publish_delayed`](RedisTransport::publish_delayed). A URL cannot
    /// turn it off again.
    ///
    /// ```no_run
    /// use babel_idem::transport::RedisTransport;
    ///
    /// # async fn run() -> Result<(), babel_idem::transport::TransportError> {
    /// // The same as connecting to "redis://127.0.0.1:6379/0?laravel=1".
    /// let transport = RedisTransport::builder()
    ///     .laravel_layout()
    ///     .connect("redis://127.0.0.1:6379/0")
    ///     .await?;
    /// // RPUSH queues:orders, and a wake-up token to queues:orders:notify.
    /// transport.publish("orders", br#"{"job":"urn:babel:orders:created","attempts":0}"#).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn laravel_layout(self) -> Self {
        self.with_options(|options| options.laravel = true)
    }

    /// The prefix of the Laravel layout's keys (default `queues:`, the
    /// Python SDK's `key_prefix`); a URL's `prefix=` overrides it. The
    /// legacy layout has no prefix.
    pub fn key_prefix(self, prefix: &str) -> Self {
        let prefix = prefix.to_owned();
        self.with_options(|options| options.prefix = prefix)
    }

    /// Connects to `url` (`redis://[user:password@]host:port/db`, with the
    /// Python SDK's optional `?retry_after=SECS|null`, and `laravel=1`
    /// (or `laravel_compat=1`) with an optional `prefix=` for the Laravel
    /// layout). Fails at once, with an error that says why, on a malformed
    /// URL or a server that cannot be reached. Must be called
    /// inside a Tokio runtime. Once connected, a lost connection is
    /// re-established by the next operation.
    ///
    /// ```
    /// use babel_idem::transport::{RedisTransport, TransportError};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// // A malformed URL is refused before anything connects.
    /// let error = RedisTransport::connect("redis://127.0.0.1:notaport/").await.unwrap_err();
    /// assert!(matches!(error, TransportError::InvalidUrl { .. }), "{error}");
    /// # });
    /// ```
    pub async fn connect(self, url: &str) -> Result<RedisTransport, TransportError> {
        let ParsedUrl {
            address,
            retry_after,
            laravel,
        } = self.parse_url(url)?;
        let connection = if is_cluster_url(address) {
            self.connect_cluster(url, address).await?
        } else {
            let client = Client::open(address)
                .map_err(|e| TransportError::invalid_url(url, e.to_string()))?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(self.timeout))
                .set_response_timeout(Some(self.timeout))
                .set_number_of_retries(self.reconnect_attempts)
                .set_min_delay(Duration::from_millis(50))
                .set_max_delay(Duration::from_secs(1));
            let connection = ConnectionManager::new_with_config(client, config)
                .await
                .map_err(|e| TransportError::Connect(Box::new(e)))?;
            Connection::Single(connection)
        };
        let scripts = match laravel {
            Some(_) => Laravel::scripts(),
            None => Scripts {
                reserve: layout_script!("reserve.lua"),
                sweep: layout_script!("sweep.lua"),
                settle: layout_script!("settle.lua"),
                extend: layout_script!("extend.lua"),
            },
        };
        Ok(RedisTransport {
            connection,
            retry_after,
            laravel: laravel.map(|prefix| Arc::new(Laravel::new(prefix))),
            scripts: Arc::new(scripts),
            tokens: Arc::new(Tokens::new()),
            settles: Arc::new(Coalescer::new()),
        })
    }

    /// A connection to the cluster `address` names, checked to answer.
    #[cfg(feature = "redis-cluster")]
    async fn connect_cluster(
        &self,
        url: &str,
        address: &str,
    ) -> Result<Connection, TransportError> {
        use crate::redis_client::cluster::{ClusterOpenError, connect};
        match connect(address, self.timeout, self.reconnect_attempts).await {
            Ok(connection) => Ok(Connection::cluster(connection)),
            Err(ClusterOpenError::Url(reason)) => Err(TransportError::invalid_url(url, reason)),
            Err(error) => Err(TransportError::Connect(Box::new(error))),
        }
    }

    #[cfg(not(feature = "redis-cluster"))]
    async fn connect_cluster(
        &self,
        url: &str,
        _address: &str,
    ) -> Result<Connection, TransportError> {
        Err(TransportError::invalid_url(
            url,
            "a Redis Cluster URL needs babel-idem's `redis-cluster` feature",
        ))
    }

    /// Splits the Python SDK's query parameters off `url`.
    fn parse_url<'u>(&self, url: &'u str) -> Result<ParsedUrl<'u>, TransportError> {
        let invalid = |reason: String| TransportError::invalid_url(url, reason);
        if !(url.starts_with("redis://") || url.starts_with("rediss://") || is_cluster_url(url)) {
            return Err(invalid(
                "expected redis://host:port/db, rediss://host:port/db or \
                 redis+cluster://host:port[,host:port...]"
                    .to_owned(),
            ));
        }
        super::binding::check_credentials(url)?;
        let (address, query) = url.split_once('?').unwrap_or((url, ""));
        let mut retry_after = self.options.retry_after;
        let mut laravel = self.options.laravel;
        let mut prefix = self.options.prefix.clone();
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match name {
                "retry_after"
                    if value.eq_ignore_ascii_case("null") || value.eq_ignore_ascii_case("none") =>
                {
                    retry_after = None;
                }
                "retry_after" => {
                    let seconds: u64 = value.parse().map_err(|_| {
                        invalid(format!(
                            "retry_after must be a whole number of seconds or null, got {value:?}"
                        ))
                    })?;
                    retry_after = Some(Duration::from_secs(seconds));
                }
                "laravel" | "laravel_compat"
                    if matches!(
                        value.to_ascii_lowercase().as_str(),
                        "1" | "true" | "yes" | "on"
                    ) =>
                {
                    laravel = true;
                }
                "prefix" => {
                    if let Some(value) = laravel::url_prefix(value) {
                        prefix = value;
                    }
                }
                _ => {}
            }
        }
        Ok(ParsedUrl {
            address,
            retry_after,
            laravel: laravel.then_some(prefix),
        })
    }
}

impl RedisTransport {
    /// A transport with the default settings; see `connect`
    /// on [`RedisTransportBuilder`].
    pub async fn connect(url: &str) -> Result<Self, TransportError> {
        Self::builder().connect(url).await
    }

    /// Configures a transport: reservation lifetime, timeouts, reconnects.
    pub fn builder() -> RedisTransportBuilder {
        RedisTransportBuilder::default()
    }

    /// Appends `body` to `queue` (`RPUSH`), as every BabelQueue producer does;
    /// in the Laravel layout, to `<prefix><queue>` with a wake-up token on
    /// its `:notify` list (Laravel's push, one script).
    pub async fn publish(&self, queue: &str, body: &[u8]) -> Result<(), TransportError> {
        self.check_queue(queue)?;
        if let Some(laravel) = &self.laravel {
            return self.push_laravel(laravel, queue, body).await;
        }
        let mut connection = self.connection.clone();
        ::redis::cmd("RPUSH")
            .arg(queue)
            .arg(body)
            .query_async::<()>(&mut connection)
            .await
            .map_err(broker)
    }

    /// Appends `body` to `queue` with transport headers beside it, in a
    /// `__bq_frame` frame (the Python SDK's `publish_with_headers`). Blank
    /// names and values are dropped; with none left the body is stored bare.
    /// The Laravel layout stores no headers (its pop decodes the stored
    /// job): they are dropped and the body is published bare, as the Python
    /// SDK does.
    pub async fn publish_with_headers(
        &self,
        queue: &str,
        body: &str,
        headers: &[(String, String)],
    ) -> Result<(), TransportError> {
        if self.laravel.is_some() {
            return self.publish(queue, body.as_bytes()).await;
        }
        let value = frame::frame(body.as_bytes(), headers)
            .expect("a &str body is UTF-8, so it can always be framed");
        self.publish(queue, &value).await
    }

    /// Returns the reservations of `queue` whose deadline has lapsed to the
    /// end of the queue; how many moved. [`reserve`](Transport::reserve)
    /// sweeps first on its own; this is for tools and tests. In the Laravel
    /// layout, the due delayed jobs and the lapsed reservations go back to
    /// the end of the ready list (the migrations a reserve makes first).
    pub async fn sweep(&self, queue: &str) -> Result<u64, TransportError> {
        self.check_queue(queue)?;
        if let Some(laravel) = &self.laravel {
            return self.migrate_laravel(laravel, queue).await;
        }
        let mut connection = self.connection.clone();
        self.scripts
            .sweep
            .key(queue)
            .key(processing(queue))
            .key(deadlines(queue))
            .arg(-1)
            .invoke_async(&mut connection)
            .await
            .map_err(broker)
    }

    /// How long a reservation lasts, as the reserve script takes it: whole
    /// seconds, rounded up, or `+inf`. The script adds it to the server's
    /// clock.
    fn lifetime_argument(&self) -> String {
        match self.retry_after {
            None => "+inf".to_owned(),
            Some(retry_after) => whole_seconds_up(retry_after).to_string(),
        }
    }

    async fn reserve_batch(
        &self,
        queue: &str,
        max: usize,
    ) -> Result<Vec<Reserved<RedisHandle>>, RedisError> {
        let tokens: Vec<String> = (0..max).map(|_| self.tokens.next()).collect();
        let (processing, deadlines) = (processing(queue), deadlines(queue));
        let mut command = ::redis::cmd("EVALSHA");
        command
            .arg(self.scripts.reserve.get_hash())
            .arg(3)
            .arg(queue)
            .arg(&processing)
            .arg(&deadlines)
            .arg(self.lifetime_argument())
            .arg(&tokens);
        let mut connection = self.connection.clone();
        let raws: Vec<Vec<u8>> = match command.query_async(&mut connection).await {
            Ok(raws) => raws,
            // A restarted server has forgotten the script; it did not run,
            // so loading it and asking again is safe.
            Err(error) if is_no_script(&error) => {
                self.scripts.reserve.load_async(&mut connection).await?;
                command.query_async(&mut connection).await?
            }
            Err(error) => return Err(error),
        };
        let queue: Arc<str> = Arc::from(queue);
        Ok(raws
            .into_iter()
            .zip(tokens)
            .map(|(raw, token)| {
                let (body, headers) = frame::unframe(raw.clone());
                Reserved {
                    body,
                    headers: headers.clone(),
                    attempts: None,
                    poison: false,
                    handle: RedisHandle {
                        queue: Arc::clone(&queue),
                        raw,
                        token,
                        headers,
                    },
                }
            })
            .collect())
    }

    /// The settle script as an `EVALSHA` for one reservation: the optional
    /// third key receives the requeued or dead-lettered value.
    fn settle_command(&self, handle: &RedisHandle, settlement: &Settlement) -> Cmd {
        if let Some(laravel) = &self.laravel {
            return self.settle_command_laravel(laravel, handle, settlement);
        }
        let queue = &*handle.queue;
        let target = settlement.destination(queue);
        let mut command = ::redis::cmd("EVALSHA");
        command
            .arg(self.scripts.settle.get_hash())
            .arg(2 + usize::from(target.is_some()))
            .arg(processing(queue))
            .arg(deadlines(queue));
        if let Some((target, _)) = target {
            command.arg(target);
        }
        command.arg(&handle.token).arg(&handle.raw);
        if let Some((_, body)) = target {
            // The delivery's headers travel with it, framed as they came; a
            // body that cannot be framed (not UTF-8) goes bare.
            match frame::frame(body, &handle.headers) {
                Some(value) => command.arg(value),
                None => command.arg(body),
            };
        }
        command
    }

    /// Runs settle commands in one pipeline: whether each settled, or the
    /// error the script answered for it (a settle that fails changes
    /// nothing). `Err` when the pipeline as a whole failed.
    async fn settle_pipeline(
        &self,
        commands: Vec<Cmd>,
    ) -> Result<Vec<RedisResult<bool>>, RedisError> {
        if self.connection.is_cluster() {
            return self.settle_by_queue(commands).await;
        }
        self.settle_pipelined(commands).await
    }

    /// Sends `commands` in one [`settle_pipe`]: each settle's answer. A
    /// restarted server has forgotten the script: the settles it refused
    /// did not run, so the script is loaded and those are sent again.
    async fn settle_pipelined(
        &self,
        commands: Vec<Cmd>,
    ) -> Result<Vec<RedisResult<bool>>, RedisError> {
        let mut connection = self.connection.clone();
        let pipeline = settle_pipe(commands);
        let mut settled = settle_each(&pipeline, &mut connection).await?;
        let forgotten: Vec<usize> = (0..settled.len())
            .filter(|&i| matches!(&settled[i], Err(error) if is_no_script(error)))
            .collect();
        if !forgotten.is_empty() {
            self.scripts.settle.load_async(&mut connection).await?;
            let sent: Vec<&Cmd> = pipeline.cmd_iter().collect();
            let again = settle_pipe(forgotten.iter().map(|&i| sent[i].clone()));
            let answers = settle_each(&again, &mut connection).await?;
            for (i, answer) in forgotten.into_iter().zip(answers) {
                settled[i] = answer;
            }
        }
        Ok(settled)
    }

    /// On a cluster, the settles of each queue (one slot) in a pipeline of
    /// their own, all at once; answers in the commands' order.
    async fn settle_by_queue(
        &self,
        commands: Vec<Cmd>,
    ) -> Result<Vec<RedisResult<bool>>, RedisError> {
        // A settle's first key is `<queue>:processing` (Laravel:
        // `<prefix><queue>:reserved`), in the queue's slot.
        let mut queues: Vec<(Vec<u8>, Vec<usize>)> = Vec::new();
        for (i, command) in commands.iter().enumerate() {
            let key = match command.args_iter().nth(3) {
                Some(::redis::Arg::Simple(key)) => key.to_vec(),
                _ => Vec::new(),
            };
            match queues.iter_mut().find(|(queue, _)| *queue == key) {
                Some((_, indices)) => indices.push(i),
                None => queues.push((key, vec![i])),
            }
        }
        let answers = crate::redis_client::join_all(queues.iter().map(|(_, indices)| {
            let share: Vec<Cmd> = indices.iter().map(|&i| commands[i].clone()).collect();
            self.settle_pipelined(share)
        }))
        .await;
        let mut settled: Vec<Option<RedisResult<bool>>> = commands.iter().map(|_| None).collect();
        for ((_, indices), answer) in queues.iter().zip(answers) {
            for (&i, one) in indices.iter().zip(answer?) {
                settled[i] = Some(one);
            }
        }
        Ok(settled
            .into_iter()
            .map(|one| {
                one.unwrap_or_else(|| {
                    Err(RedisError::from((
                        ::redis::ErrorKind::Parse,
                        "the server sent no answer to the settle",
                    )))
                })
            })
            .collect())
    }

    /// Settles one reservation; the settles that meet share one pipeline.
    async fn settle_coalesced(
        &self,
        handle: &RedisHandle,
        settlement: &Settlement,
    ) -> Result<bool, TransportError> {
        #[cfg(feature = "redis-cluster")]
        if self.connection.is_cluster()
            && let Some((target, _)) = settlement.destination(&handle.queue)
        {
            use crate::redis_client::cluster::slot;
            if slot(self.key(target).as_bytes()) != slot(self.key(&handle.queue).as_bytes()) {
                return Err(TransportError::InvalidQueue {
                    queue: target.to_owned(),
                    reason: "on a Redis Cluster the dead-letter queue must carry the queue's hash \
                             tag (the default <queue>.dlq does), so one script can move the \
                             delivery there; nothing was touched",
                });
            }
        }
        let command = self.settle_command(handle, settlement);
        let batched = self
            .settles
            .call(command, |commands| async {
                self.settle_pipeline(commands).await.ok()
            })
            .await;
        let settled = match batched {
            Some(settled) => settled,
            // The shared pipeline failed: this settle alone, for its own error.
            None => {
                let command = self.settle_command(handle, settlement);
                let mut settled = self.settle_pipeline(vec![command]).await.map_err(broker)?;
                settled.pop().unwrap_or_else(|| {
                    Err(RedisError::from((
                        ::redis::ErrorKind::Parse,
                        "the server sent no answer to the settle",
                    )))
                })
            }
        }
        .map_err(broker)?;
        if !settled {
            tracing::warn!(
                queue = &*handle.queue,
                "babel-idem: the Redis reservation lapsed before it was settled; the sweep returned it and it may be delivered again. Nothing was touched."
            );
        }
        Ok(settled)
    }
}

impl RedisTransport {
    /// Moves a reservation's deadline `retry_after` past the server's now
    /// (`extend.lua`); with no recovery its deadline is `+inf` already.
    async fn extend_reservation(&self, handle: &RedisHandle) -> Result<bool, TransportError> {
        let Some(retry_after) = self.retry_after else {
            return Ok(true);
        };
        if let Some(laravel) = &self.laravel {
            return self.extend_laravel(laravel, handle, retry_after).await;
        }
        let seconds = whole_seconds_up(retry_after);
        let mut connection = self.connection.clone();
        let extended: i64 = self
            .scripts
            .extend
            .key(deadlines(&handle.queue))
            .arg(&handle.token)
            .arg(&handle.raw)
            .arg(seconds)
            .invoke_async(&mut connection)
            .await
            .map_err(broker)?;
        Ok(extended == 1)
    }
}

impl Transport for RedisTransport {
    type Handle = RedisHandle;

    /// A queue name must be non-empty, at most 512 bytes, with no whitespace
    /// or control characters, and must not end in the layout's own suffixes
    /// (`:processing`, `:processing:deadlines`; in the Laravel layout
    /// `:reserved`, `:delayed`, `:notify`), whose keys it would collide with.
    ///
    /// On a Redis Cluster the name (with the Laravel layout's prefix) must
    /// also carry a hash tag (`{orders}`), so every key of the queue's
    /// layout is in one slot.
    fn check_queue(&self, queue: &str) -> Result<(), TransportError> {
        self.queue_names().check(queue)?;
        #[cfg(feature = "redis-cluster")]
        if self.connection.is_cluster()
            && crate::redis_client::cluster::hash_tag(self.key(queue).as_bytes()).is_none()
        {
            return Err(TransportError::InvalidQueue {
                queue: queue.to_owned(),
                reason: "on a Redis Cluster a queue name needs a hash tag, such as {orders} or \
                         jobs:{orders}: the queue's keys (<queue>, <queue>:processing, \
                         <queue>:processing:deadlines, <queue>.dlq) must share one slot for its \
                         scripts to run",
            });
        }
        Ok(())
    }

    /// The builder's [`retry_after`](TransportBuilder::retry_after)
    /// (or the URL's), `None` with [`no_recovery`](TransportBuilder::no_recovery).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), babel_idem::transport::TransportError> {
    /// use babel_idem::transport::{RedisTransport, Transport};
    /// use std::time::Duration;
    ///
    /// let transport = RedisTransport::connect("redis://127.0.0.1:6379/?retry_after=30").await?;
    /// assert_eq!(transport.reservation_lifetime(), Some(Duration::from_secs(30)));
    /// # Ok(())
    /// # }
    /// ```
    fn reservation_lifetime(&self) -> Option<Duration> {
        self.retry_after
    }

    /// `true`: a reservation's deadline member is moved forward by
    /// [`extend`](Transport::extend), on the server's clock.
    fn extends_reservations(&self) -> bool {
        true
    }

    /// Moves the reservation's deadline to the server's `TIME` plus
    /// `retry_after`, gated on its deadline member as a settle is: a
    /// reservation the sweep took back is not revived.
    fn extend<'a>(&'a self, handle: &'a RedisHandle) -> TransportFuture<'a, bool> {
        Box::pin(self.extend_reservation(handle))
    }

    fn reserve<'a>(
        &'a self,
        queue: &'a str,
        max: usize,
    ) -> TransportFuture<'a, Vec<Reserved<RedisHandle>>> {
        Box::pin(async move {
            if max == 0 {
                return Ok(Vec::new());
            }
            if let Some(laravel) = &self.laravel {
                return self
                    .reserve_laravel(laravel, queue, max)
                    .await
                    .map_err(broker);
            }
            self.reserve_batch(queue, max).await.map_err(broker)
        })
    }

    fn settle<'a>(
        &'a self,
        handle: &'a RedisHandle,
        settlement: &'a Settlement,
    ) -> TransportFuture<'a, bool> {
        Box::pin(self.settle_coalesced(handle, settlement))
    }
}

impl fmt::Debug for RedisTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisTransport")
            .field("retry_after", &self.retry_after)
            .field("laravel", &self.laravel)
            .finish_non_exhaustive()
    }
}

impl RedisTransport {
    /// The queue names the layout can hold.
    fn queue_names(&self) -> &'static QueueNames {
        match &self.laravel {
            Some(_) => &laravel::QUEUE_NAMES,
            None => &QUEUE_NAMES,
        }
    }

    /// The key that names `queue` in the layout: the queue itself, or in
    /// the Laravel layout its ready list.
    fn key(&self, queue: &str) -> String {
        match &self.laravel {
            Some(laravel) => laravel.ready(queue),
            None => queue.to_owned(),
        }
    }
}

fn processing(queue: &str) -> String {
    format!("{queue}{PROCESSING_SUFFIX}")
}

fn deadlines(queue: &str) -> String {
    format!("{queue}{DEADLINES_SUFFIX}")
}

/// `time` in whole seconds, rounded up. The reserve script adds it to the
/// server's clock, also rounded up, and the sweep takes a reservation back
/// once the server's whole seconds reach that score: the reservation lasts
/// at least `retry_after` (and less than two seconds more), which is what
/// [`Transport::reservation_lifetime`] promises the consumer. The Python SDK
/// writes `floor(now) + retry_after`, which can lapse up to a second early.
fn whole_seconds_up(time: Duration) -> u64 {
    time.as_secs() + u64::from(time.subsec_nanos() > 0)
}

/// Settle commands in one pipeline that answers for each command apart: an
/// error in one leaves the others' answers.
fn settle_pipe(commands: impl IntoIterator<Item = Cmd>) -> ::redis::Pipeline {
    let mut pipeline = ::redis::pipe();
    for command in commands {
        pipeline.add_command(command);
    }
    pipeline.ignore_errors();
    pipeline
}

/// Sends a [`settle_pipe`]: each settle's answer, `1` settled, `0` lapsed,
/// or the error it met.
async fn settle_each(
    pipeline: &::redis::Pipeline,
    connection: &mut Connection,
) -> Result<Vec<RedisResult<bool>>, RedisError> {
    let answers: Vec<RedisResult<i64>> = pipeline.query_async(connection).await?;
    Ok(answers
        .into_iter()
        .map(|answer| answer.map(|settled| settled == 1))
        .collect())
}

/// Whether `url` names a Redis Cluster (`redis+cluster://`, `rediss+cluster://`).
fn is_cluster_url(url: &str) -> bool {
    url.starts_with("redis+cluster://") || url.starts_with("rediss+cluster://")
}

fn is_no_script(error: &RedisError) -> bool {
    error.kind() == ::redis::ErrorKind::Server(::redis::ServerErrorKind::NoScript)
}

fn broker(error: RedisError) -> TransportError {
    TransportError::Broker(Box::new(error))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The script adds this to the server's clock rounded up: rounding
    /// `retry_after` down would let a reservation lapse before it.
    #[test]
    fn retry_after_goes_to_the_reserve_script_in_whole_seconds_rounded_up() {
        for (millis, seconds) in [
            (0, 0),
            (1, 1),
            (999, 1),
            (1_000, 1),
            (1_001, 2),
            (90_000, 90),
        ] {
            assert_eq!(
                whole_seconds_up(Duration::from_millis(millis)),
                seconds,
                "{millis} ms"
            );
        }
        assert_eq!(
            whole_seconds_up(Duration::from_secs(u64::MAX)),
            u64::MAX,
            "the largest lifetime does not overflow"
        );
    }

    #[test]
    fn queue_names_the_layout_cannot_hold_are_refused() {
        for bad in [
            "",
            "has space",
            "tab\there",
            "line\nbreak",
            "q:processing",
            "q:processing:deadlines",
        ] {
            let error = QUEUE_NAMES.check(bad).unwrap_err();
            assert!(
                matches!(error, TransportError::InvalidQueue { .. }),
                "{bad:?}"
            );
        }
        assert!(QUEUE_NAMES.check(&"q".repeat(513)).is_err());
        for good in ["orders", "billing.invoices", "queues:orders", "é-queue"] {
            QUEUE_NAMES.check(good).unwrap();
        }
    }

    #[test]
    fn url_parameters_follow_the_python_sdk() {
        let builder = RedisTransport::builder();
        let parsed = builder.parse_url("redis://h:1/0?retry_after=7").unwrap();
        assert_eq!(
            (parsed.address, parsed.retry_after, parsed.laravel),
            ("redis://h:1/0", Some(Duration::from_secs(7)), None)
        );
        assert_eq!(
            builder
                .parse_url("redis://h/0?retry_after=null")
                .unwrap()
                .retry_after,
            None
        );
        let bad = builder
            .parse_url("redis://h/0?retry_after=soon")
            .unwrap_err();
        assert!(bad.to_string().contains("retry_after"), "{bad}");
        for (url, prefix) in [
            ("redis://h/0?laravel=1", "queues:"),
            ("redis://h/0?laravel_compat=true&prefix=app%3A", "app:"),
            ("redis://h/0?prefix=&laravel=on", "queues:"),
        ] {
            let parsed = builder.parse_url(url).unwrap();
            assert_eq!(parsed.laravel.as_deref(), Some(prefix), "{url}");
        }
        assert_eq!(
            builder.parse_url("redis://h/0?laravel=0").unwrap().laravel,
            None
        );
        let chosen = RedisTransport::builder()
            .laravel_layout()
            .key_prefix("app:");
        let parsed = chosen.parse_url("redis://h/0?laravel=0").unwrap();
        assert_eq!(parsed.laravel.as_deref(), Some("app:"));
        let scheme = builder.parse_url("http://h/0").unwrap_err();
        assert!(scheme.to_string().contains("redis://"), "{scheme}");
    }
}
