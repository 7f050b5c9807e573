//! Redis Cluster: the `redis+cluster://` URL, the client built from it, and
//! the slot arithmetic the store and the transport group their keys by.
//!
//! A key's slot is CRC16 (XMODEM) of its hash tag, modulo 16384: the bytes
//! between the first `{` and the first `}` after it when there are any,
//! else of the whole key. Keys with one hash tag share a slot, so one
//! script or `MULTI` may touch them all.

use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use ::redis::cluster::ClusterClientBuilder;
use ::redis::cluster_async::ClusterConnection;
use ::redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use ::redis::{Cmd, ErrorKind, FromRedisValue, RedisError, Script, ServerErrorKind, Value};

use super::join_all;

/// How many slots a cluster has.
pub(crate) const SLOTS: u16 = 16384;

/// The seed nodes of a `redis[s]+cluster://[user[:password]@]host:port[,host:port...][/[0]]`
/// URL, each as the node URL the client connects to (`redis://` or
/// `rediss://`, with the URL's credentials). Why not, when it is malformed.
pub(crate) fn seed_nodes(url: &str) -> Result<Vec<String>, String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| "expected redis+cluster://host:port[,host:port...]".to_owned())?;
    let node_scheme = match scheme {
        "redis+cluster" => "redis",
        "rediss+cluster" => "rediss",
        _ => return Err("expected redis+cluster:// or rediss+cluster://".to_owned()),
    };
    let (before_query, _query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, path) = before_query.split_once('/').unwrap_or((before_query, ""));
    if !(path.is_empty() || path == "0") {
        return Err(format!(
            "a Redis Cluster has only database 0, the URL asks for {path:?}"
        ));
    }
    let (credentials, hosts) = match authority.rsplit_once('@') {
        Some((credentials, hosts)) => (Some(credentials), hosts),
        None => (None, authority),
    };
    let nodes: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|host| !host.is_empty())
        .map(|host| match credentials {
            Some(credentials) => format!("{node_scheme}://{credentials}@{host}/"),
            None => format!("{node_scheme}://{host}/"),
        })
        .collect();
    if nodes.is_empty() {
        return Err("the URL names no node: list host:port, comma-separated".to_owned());
    }
    Ok(nodes)
}

/// A cluster client for `url`: every call times out after `timeout` (per
/// node request), a redirection or a lost node is retried up to `retries`
/// times with a backoff of at most a second, and one call as a whole gives
/// up after `3 × timeout` (a failover takes the cluster's node timeout and
/// an election; a call caught in it fails, and the next one finds the new
/// master).
fn client(
    url: &str,
    timeout: Duration,
    retries: usize,
) -> Result<::redis::cluster::ClusterClient, ClusterOpenError> {
    let nodes = seed_nodes(url).map_err(ClusterOpenError::Url)?;
    ClusterClientBuilder::new(nodes)
        .connection_timeout(timeout)
        .response_timeout(timeout)
        .overall_response_timeout(Some(timeout * 3))
        .retries(u32::try_from(retries).unwrap_or(u32::MAX))
        .min_retry_wait(50)
        .max_retry_wait(1_000)
        .build()
        .map_err(ClusterOpenError::Client)
}

/// A connection that connects on its first call, and keeps reconnecting.
pub(crate) fn connect_lazy(
    url: &str,
    timeout: Duration,
    retries: usize,
) -> Result<ClusterConnection, ClusterOpenError> {
    Ok(
        client(url, timeout, retries)?.get_pending_async_connection_with_config(
            ::redis::cluster::ClusterConfig::new()
                .set_connection_timeout(timeout)
                .set_response_timeout(timeout),
        ),
    )
}

/// A connection to a cluster that answers now: the seed nodes reached, the
/// slot map read, and `CLUSTER INFO` saying `cluster_state:ok`.
pub(crate) async fn connect(
    url: &str,
    timeout: Duration,
    retries: usize,
) -> Result<ClusterConnection, ClusterOpenError> {
    let client = client(url, timeout, retries)?;
    let mut connection = client
        .get_async_connection()
        .await
        .map_err(ClusterOpenError::Unreachable)?;
    let info: String = ::redis::cmd("CLUSTER")
        .arg("INFO")
        .query_async(&mut connection)
        .await
        .map_err(ClusterOpenError::Unreachable)?;
    if !info.lines().any(|line| line.trim() == "cluster_state:ok") {
        return Err(ClusterOpenError::NotOk);
    }
    Ok(connection)
}

/// Building a cluster connection failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClusterOpenError {
    #[error("not a usable Redis Cluster URL: {0}")]
    Url(String),
    #[error("could not set up the cluster client: {0}")]
    Client(#[source] RedisError),
    #[error(
        "no Redis Cluster answered at the URL's seed nodes (are they up, and \
         started with cluster-enabled yes?): {0}"
    )]
    Unreachable(#[source] RedisError),
    #[error(
        "the Redis Cluster answered but its CLUSTER INFO is not cluster_state:ok \
         (slots unassigned, or a master down with no replica to promote)"
    )]
    NotOk,
}

/// The bytes a key's slot is computed from: its hash tag when it has a
/// non-empty one, else `None` (the whole key).
pub(crate) fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&byte| byte == b'{')?;
    let close = key[open + 1..].iter().position(|&byte| byte == b'}')?;
    let tag = &key[open + 1..open + 1 + close];
    (!tag.is_empty()).then_some(tag)
}

/// The slot of `key`, as the cluster computes it.
pub(crate) fn slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key).unwrap_or(key)) % SLOTS
}

/// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), Redis Cluster's.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// For every slot, the shortest tag of digits and ASCII letters (the first
/// found in counting order) whose slot it is: `{<tag>}` in a key puts the
/// key in that slot.
static SLOT_TAGS: LazyLock<Vec<String>> = LazyLock::new(|| {
    const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut tags = vec![String::new(); usize::from(SLOTS)];
    let mut left = tags.len();
    let mut candidate = Vec::with_capacity(4);
    'lengths: for length in 1..=4u32 {
        for mut n in 0..ALPHABET.len().pow(length) {
            candidate.clear();
            for _ in 0..length {
                candidate.push(ALPHABET[n % ALPHABET.len()]);
                n /= ALPHABET.len();
            }
            let entry = &mut tags[usize::from(crc16(&candidate) % SLOTS)];
            if entry.is_empty() {
                *entry = String::from_utf8_lossy(&candidate).into_owned();
                left -= 1;
                if left == 0 {
                    break 'lengths;
                }
            }
        }
    }
    tags
});

/// A short hash tag (no braces) whose slot is `slot`.
pub(crate) fn slot_tag(slot: u16) -> &'static str {
    &SLOT_TAGS[usize::from(slot % SLOTS)]
}

/// The masters that serve slots now, as `(host, port)`, from `CLUSTER NODES`.
pub(crate) async fn masters(
    connection: &mut ClusterConnection,
) -> Result<Vec<(String, u16)>, RedisError> {
    let nodes: String = ::redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(connection)
        .await?;
    Ok(nodes.lines().filter_map(serving_master).collect())
}

/// A `CLUSTER NODES` line's address, when it is a master that is not
/// failing and serves at least one slot.
fn serving_master(line: &str) -> Option<(String, u16)> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let (address, flags) = (fields.get(1)?, fields.get(2)?);
    let flags: Vec<&str> = flags.split(',').collect();
    if !flags.contains(&"master") || flags.iter().any(|flag| flag.starts_with("fail")) {
        return None;
    }
    fields.get(8)?;
    let address = address.split(['@', ',']).next()?;
    let (host, port) = address.rsplit_once(':')?;
    Some((host.to_owned(), port.parse().ok()?))
}

/// Sends `command` to the node at `host:port`.
pub(crate) async fn on_node<T: FromRedisValue>(
    connection: &mut ClusterConnection,
    host: &str,
    port: u16,
    command: Cmd,
) -> Result<T, RedisError> {
    let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
        host: host.to_owned(),
        port,
    });
    let value: Value = connection.route_command(command, route).await?;
    Ok(T::from_redis_value(value)?)
}

/// Which master serves each slot, as `CLUSTER SLOTS` last said; read again
/// after any reply shows it stale.
#[derive(Default)]
pub(crate) struct SlotCache(Mutex<Option<Arc<SlotMap>>>);

struct SlotMap {
    masters: Vec<(String, u16)>,
    /// Per slot, an index into `masters`; `usize::MAX` for an unserved slot.
    master_of: Vec<usize>,
}

impl SlotCache {
    fn get(&self) -> Option<Arc<SlotMap>> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set(&self, map: Option<Arc<SlotMap>>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = map;
    }

    async fn map(&self, connection: &mut ClusterConnection) -> Result<Arc<SlotMap>, RedisError> {
        if let Some(map) = self.get() {
            return Ok(map);
        }
        let ranges: Vec<Value> = ::redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(connection)
            .await?;
        let mut map = SlotMap {
            masters: Vec::new(),
            master_of: vec![usize::MAX; usize::from(SLOTS)],
        };
        for range in &ranges {
            let Some((start, end, master)) = slot_range(range) else {
                continue;
            };
            let index = match map.masters.iter().position(|m| *m == master) {
                Some(index) => index,
                None => {
                    map.masters.push(master);
                    map.masters.len() - 1
                }
            };
            for slot in start..=end.min(usize::from(SLOTS) - 1) {
                map.master_of[slot] = index;
            }
        }
        let map = Arc::new(map);
        self.set(Some(Arc::clone(&map)));
        Ok(map)
    }
}

/// One entry of `CLUSTER SLOTS`: its first and last slot and its master's
/// `(host, port)`; none for an entry of another shape, which the map skips.
fn slot_range(range: &Value) -> Option<(usize, usize, (String, u16))> {
    let Value::Array(fields) = range else {
        return None;
    };
    let start = usize::from_redis_value_ref(fields.first()?).ok()?;
    let end = usize::from_redis_value_ref(fields.get(1)?).ok()?;
    let Value::Array(master) = fields.get(2)? else {
        return None;
    };
    let host = String::from_redis_value_ref(master.first()?).ok()?;
    let port = u16::from_redis_value_ref(master.get(1)?).ok()?;
    Some((start, end, (host, port)))
}

/// The master that serves `slot` (`host:port`) by the slot map `cache`
/// keeps (read with `CLUSTER SLOTS` when it keeps none); `None` when the
/// map cannot be read or nothing serves the slot.
pub(crate) async fn master_of(
    connection: &ClusterConnection,
    cache: &SlotCache,
    slot: u16,
) -> Option<String> {
    let mut connection = connection.clone();
    let map = cache.map(&mut connection).await.ok()?;
    let (host, port) = map.masters.get(*map.master_of.get(usize::from(slot))?)?;
    Some(format!("{host}:{port}"))
}

/// A reply that says the command did not run where it was sent: the slot
/// moved or is moving (`MOVED`, `ASK`, `TRYAGAIN`), or the node lacks the
/// script (`NOSCRIPT`, a promoted replica, a restart).
fn sent_elsewhere(error: &RedisError) -> bool {
    error.is_cluster_error() && error.kind() != ErrorKind::Server(ServerErrorKind::ClusterDown)
        || error.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

/// The slot of `command`'s first key: `EVALSHA`'s after its key count,
/// any other command's first argument.
pub(crate) fn command_slot(command: &Cmd) -> Option<u16> {
    let mut args = command.args_iter().filter_map(|arg| match arg {
        ::redis::Arg::Simple(bytes) => Some(bytes),
        _ => None,
    });
    let name = args.next()?;
    let key = if name.eq_ignore_ascii_case(b"EVALSHA") || name.eq_ignore_ascii_case(b"EVAL") {
        args.nth(2)?
    } else {
        args.next()?
    };
    Some(slot(key))
}

/// Sends `command` (the client follows its redirections and retries it
/// across a failover; a script the node lacks is loaded and the command
/// sent again), then `WAIT <replicas> <timeout ms>` to the master of its
/// slot, which after a redirection is the node that ran it: its reply, and
/// how many replicas confirmed it.
pub(crate) async fn with_wait(
    connection: &mut ClusterConnection,
    command: &Cmd,
    script: Option<&Script>,
    (replicas, timeout_ms): (u32, u64),
) -> Sent {
    let mut reply = command.query_async::<Value>(connection).await;
    if let (Err(error), Some(script)) = (&reply, script)
        && error.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
    {
        reply = match script.load_async(connection).await {
            Ok(_) => command.query_async::<Value>(connection).await,
            Err(error) => Err(error),
        };
    }
    if reply.is_err() {
        return Sent {
            reply,
            replicas: None,
        };
    }
    let Some(slot) = command_slot(command) else {
        return Sent {
            reply,
            replicas: Some(0),
        };
    };
    let mut wait = ::redis::cmd("WAIT");
    wait.arg(replicas).arg(timeout_ms);
    let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
        slot,
        SlotAddr::Master,
    )));
    match connection.route_command(wait, route).await {
        Ok(Value::Int(acknowledged)) => Sent {
            reply,
            replicas: Some(acknowledged),
        },
        Ok(_) => Sent {
            reply,
            replicas: Some(0),
        },
        Err(error) => Sent {
            reply: Err(error),
            replicas: None,
        },
    }
}

/// Sends `command` as a single-node request to the master of its first
/// key's slot, so the client follows `MOVED` and `ASK` for it and reads its
/// slot map again (a multi-key command it would split by slot instead, and
/// a redirection of one part would end the call).
async fn to_slot(connection: &mut ClusterConnection, command: &Cmd) -> Result<Value, RedisError> {
    match command_slot(command) {
        Some(slot) => {
            let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
                slot,
                SlotAddr::Master,
            )));
            connection.route_command(command.clone(), route).await
        }
        None => command.query_async::<Value>(connection).await,
    }
}

/// What one command of [`by_master`] got: its reply (or error), and with a
/// `WAIT`, how many replicas confirmed the pipeline that carried it.
pub(crate) struct Sent {
    pub(crate) reply: Result<Value, RedisError>,
    pub(crate) replicas: Option<i64>,
}

/// Sends `commands` (each `(slot, command)`, every key of a command in its
/// slot) in one pipeline per master, all pipelines at once; with `wait`
/// (`replicas`, `timeout ms`), each pipeline ends with `WAIT`. A command a
/// master answered as not its own (the slot map was stale: a resharding,
/// a failover) or whose script it lacked did not run there: it is sent
/// again on its own, where the client's redirections take it, after the
/// script is loaded. The replies come in the commands' order.
pub(crate) async fn by_master(
    connection: &ClusterConnection,
    cache: &SlotCache,
    commands: Vec<(u16, Cmd)>,
    script: Option<&Script>,
    wait: Option<(u32, u64)>,
) -> Vec<Sent> {
    let mut connection = connection.clone();
    let map = match cache.map(&mut connection).await {
        Ok(map) => map,
        Err(error) => {
            return commands
                .iter()
                .map(|_| Sent {
                    reply: Err(error.clone()),
                    replicas: None,
                })
                .collect();
        }
    };
    // Per master, the indices of its commands; unserved slots go alone.
    let mut shares: Vec<Vec<usize>> = vec![Vec::new(); map.masters.len()];
    let mut alone = Vec::new();
    for (i, (slot, _)) in commands.iter().enumerate() {
        match map.master_of.get(usize::from(*slot)) {
            Some(&master) if master != usize::MAX => shares[master].push(i),
            _ => alone.push(i),
        }
    }
    let pipelines = join_all(
        shares
            .iter()
            .enumerate()
            .filter(|(_, share)| !share.is_empty())
            .map(|(master, share)| {
                let mut connection = connection.clone();
                let (host, port) = map.masters[master].clone();
                let mut pipeline = ::redis::pipe();
                for &i in share {
                    pipeline.add_command(commands[i].1.clone());
                }
                if let Some((replicas, timeout_ms)) = wait {
                    pipeline.cmd("WAIT").arg(replicas).arg(timeout_ms);
                }
                let count = share.len() + usize::from(wait.is_some());
                async move {
                    let route = SingleNodeRoutingInfo::ByAddress { host, port };
                    (
                        share,
                        connection.route_pipeline(pipeline, 0, count, route).await,
                    )
                }
            }),
    )
    .await;
    let mut sent: Vec<Option<Sent>> = commands.iter().map(|_| None).collect();
    let mut stale = false;
    for (share, answer) in pipelines {
        match answer {
            Ok(mut values) => {
                let replicas = match wait {
                    Some(_) => match values.pop() {
                        Some(Value::Int(replicas)) => Some(replicas),
                        _ => Some(0),
                    },
                    None => None,
                };
                for (&i, value) in share.iter().zip(values) {
                    let reply = match value {
                        Value::ServerError(error) => Err(RedisError::from(error)),
                        value => Ok(value),
                    };
                    if matches!(&reply, Err(error) if sent_elsewhere(error)) {
                        stale |= matches!(&reply, Err(error) if error.is_cluster_error());
                        alone.push(i);
                    } else {
                        sent[i] = Some(Sent { reply, replicas });
                    }
                }
            }
            // The client followed a redirection of the pipeline and met
            // another: its slots moved. Each command goes again alone (one
            // already run where it was first sent finds its own effect: a
            // claim held, a mark set, a commit's claim gone).
            Err(error) if sent_elsewhere(&error) => {
                stale = true;
                alone.extend(share.iter().copied());
            }
            Err(error) => {
                // The master may be gone: read the map again next time.
                stale = true;
                for &i in share {
                    sent[i] = Some(Sent {
                        reply: Err(error.clone()),
                        replicas: None,
                    });
                }
            }
        }
    }
    if stale {
        cache.set(None);
    }
    if !alone.is_empty() {
        if let Some(script) = script {
            let _ = script.load_async(&mut connection).await;
        }
        let retried = join_all(alone.iter().map(|&i| {
            let mut connection = connection.clone();
            let command = commands[i].1.clone();
            async move {
                match wait {
                    None => Sent {
                        reply: to_slot(&mut connection, &command).await,
                        replicas: None,
                    },
                    Some(wait) => with_wait(&mut connection, &command, script, wait).await,
                }
            }
        }))
        .await;
        for (&i, answer) in alone.iter().zip(retried) {
            sent[i] = Some(answer);
        }
    }
    sent.into_iter()
        .map(|answer| {
            answer.unwrap_or_else(|| Sent {
                reply: Err(RedisError::from((
                    ErrorKind::Client,
                    "no reply came for this command",
                ))),
                replicas: None,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_the_redis_cluster_specification() {
        // The specification's check value, and keys whose slots a server reported.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
        assert_eq!(slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % SLOTS);
        assert_eq!(slot(b"foo{{bar}}zap"), crc16(b"{bar") % SLOTS);
        assert_eq!(slot(b"foo{bar}{zap}"), crc16(b"bar") % SLOTS);
        assert_eq!(hash_tag(b"{orders}"), Some(&b"orders"[..]));
        assert_eq!(hash_tag(b"orders"), None);
        assert_eq!(hash_tag(b"{}orders"), None);
    }

    #[test]
    fn a_command_is_routed_by_its_first_key() {
        let mut set = ::redis::cmd("SET");
        set.arg("{a}x").arg(1);
        let mut script = ::redis::cmd("EVALSHA");
        script
            .arg("0123")
            .arg(2)
            .arg("{b}y")
            .arg("{b}z")
            .arg("owner");
        assert_eq!(command_slot(&set), Some(slot(b"a")));
        assert_eq!(command_slot(&script), Some(slot(b"b")));
    }

    #[test]
    fn every_slot_has_a_tag_that_lands_in_it() {
        for slot_number in 0..SLOTS {
            let tag = slot_tag(slot_number);
            assert!(!tag.is_empty() && tag.len() <= 4, "{slot_number}: {tag:?}");
            assert_eq!(slot(format!("x{{{tag}}}y").as_bytes()), slot_number);
        }
    }

    #[test]
    fn cluster_urls_give_their_seed_nodes_with_credentials_and_tls() {
        assert_eq!(
            seed_nodes("redis+cluster://127.0.0.1:7000,127.0.0.1:7001/").unwrap(),
            ["redis://127.0.0.1:7000/", "redis://127.0.0.1:7001/"]
        );
        assert_eq!(
            seed_nodes("rediss+cluster://app:s3cret@a:7000,b:7000").unwrap(),
            ["rediss://app:s3cret@a:7000/", "rediss://app:s3cret@b:7000/"]
        );
        assert!(
            seed_nodes("redis+cluster://a:7000/1")
                .unwrap_err()
                .contains("database 0")
        );
        assert!(
            seed_nodes("redis+cluster:///")
                .unwrap_err()
                .contains("no node")
        );
        assert!(seed_nodes("redis://a:7000").is_err());
    }

    #[test]
    fn cluster_nodes_lines_give_the_serving_masters() {
        let master = "2b09 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460";
        let replica = "599a 127.0.0.1:7003@17003 slave 2b09 0 0 1 connected";
        let failed = "1536 127.0.0.1:7001@17001 master,fail - 0 0 2 connected 5461-10922";
        let empty = "2a89 127.0.0.1:7002@17002 master - 0 0 3 connected";
        assert_eq!(serving_master(master), Some(("127.0.0.1".to_owned(), 7000)));
        assert_eq!(serving_master(replica), None);
        assert_eq!(serving_master(failed), None);
        assert_eq!(serving_master(empty), None);
    }
}
