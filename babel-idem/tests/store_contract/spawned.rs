//! Servers a test starts and stops itself, on a free port and a data
//! directory of its own: the outage tests kill these, never the shared ones.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::servers::{skip_or_fail, unique_suffix};

/// How long a spawned server may take to answer after it was started.
const STARTUP_LIMIT: Duration = Duration::from_secs(30);

/// A port nothing listens on right now.
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("a local address").port()
}

fn scratch_dir(kind: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("babel-idem-{kind}-{}", unique_suffix()));
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    dir
}

fn run(command: &mut Command) {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("run {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A `redis-server` of the test's own, persisting to an append-only file so
/// that what was remembered before a kill is still there after a restart.
pub struct OwnRedis {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl OwnRedis {
    /// A server on a free port, not started yet; `None` (after a `skipped:`
    /// line) when `redis-server` is not installed.
    pub fn reserve(test: &str) -> Option<Self> {
        if Command::new("redis-server")
            .arg("--version")
            .output()
            .is_err()
        {
            skip_or_fail(test, "redis-server is not installed");
            return None;
        }
        Some(OwnRedis {
            port: free_port(),
            dir: scratch_dir("redis"),
            child: None,
        })
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Starts the server and waits until it answers `PING`.
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "the server is already running");
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        let deadline = Instant::now() + STARTUP_LIMIT;
        while !self.answers_ping() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn answers_ping(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
        let mut reply = [0u8; 7];
        stream.write_all(b"PING\r\n").is_ok()
            && stream.read_exact(&mut reply).is_ok()
            && &reply == b"+PONG\r\n"
    }

    /// Kills the server (no shutdown courtesy: an outage) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A PostgreSQL cluster of the test's own (`initdb` + `pg_ctl`), run as the
/// `postgres` user when the test runs as root (PostgreSQL refuses root).
pub struct OwnPostgres {
    port: u16,
    bin: PathBuf,
    dir: PathBuf,
    as_postgres_user: bool,
    running: bool,
}

impl OwnPostgres {
    /// A cluster on a free port, initialised but not started; `None` (after
    /// a `skipped:` line) when the PostgreSQL server binaries are not installed.
    pub fn reserve(test: &str) -> Option<Self> {
        let Some(bin) = postgres_bin_dir() else {
            skip_or_fail(
                test,
                "no PostgreSQL server binaries under /usr/lib/postgresql",
            );
            return None;
        };
        let dir = scratch_dir("postgres");
        let as_postgres_user = running_as_root();
        if as_postgres_user {
            run(Command::new("chown").arg("postgres:").arg(&dir));
        }
        let server = OwnPostgres {
            port: free_port(),
            bin,
            dir,
            as_postgres_user,
            running: false,
        };
        let data = server.data_dir();
        run(server
            .command("initdb")
            .args([
                "--auth=trust",
                "--username=postgres",
                "--encoding=UTF8",
                "--no-sync",
            ])
            .arg("-D")
            .arg(&data));
        Some(server)
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn command(&self, program: &str) -> Command {
        let program = self.bin.join(program);
        if self.as_postgres_user {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(program);
            command
        } else {
            Command::new(program)
        }
    }

    /// Starts the cluster and waits until it accepts connections.
    pub fn start(&mut self) {
        assert!(!self.running, "the cluster is already running");
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            self.dir.display()
        );
        run(self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data_dir())
            .arg("-l")
            .arg(self.dir.join("server.log"))
            .args(["-o", &options, "-w", "-t", "30", "start"]));
        self.running = true;
    }

    /// Stops the cluster at once (`-m immediate`: no checkpoint, connections
    /// cut, like a crash) and waits for it.
    pub fn kill(&mut self) {
        if !self.running {
            return;
        }
        run(self.command("pg_ctl").arg("-D").arg(self.data_dir()).args([
            "-m",
            "immediate",
            "-w",
            "stop",
        ]));
        self.running = false;
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        if self.running {
            let _ = self
                .command("pg_ctl")
                .arg("-D")
                .arg(self.data_dir())
                .args(["-m", "immediate", "-w", "stop"])
                .output();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The newest `/usr/lib/postgresql/<version>/bin` with `initdb` in it.
fn postgres_bin_dir() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|output| output.stdout.trim_ascii() == b"0")
}

/// A RabbitMQ node of the test's own (its own node name, port, data and
/// configuration), for a broker setting the shared one must keep: the
/// largest message it takes (`max_message_size`).
pub struct OwnRabbit {
    port: u16,
    node: String,
    dir: PathBuf,
    child: Option<Child>,
}

/// RabbitMQ's own scripts, which run a node as the calling user.
const RABBIT_BIN: &str = "/usr/lib/rabbitmq/bin";

impl OwnRabbit {
    /// A node on a free port taking messages of at most `max_message_size`
    /// bytes, started; `None` (after a `skipped:` line) when RabbitMQ is
    /// not installed.
    pub fn start(test: &str, max_message_size: usize) -> Option<Self> {
        let server = PathBuf::from(RABBIT_BIN).join("rabbitmq-server");
        if !server.exists() {
            skip_or_fail(test, "RabbitMQ is not installed (no rabbitmq-server)");
            return None;
        }
        let port = free_port();
        let dir = scratch_dir("rabbitmq");
        std::fs::write(
            dir.join("rabbit.conf"),
            format!(
                "listeners.tcp.default = {port}\nmax_message_size = {max_message_size}\n\
                 loopback_users = none\n"
            ),
        )
        .expect("write the node's configuration");
        std::fs::write(dir.join("plugins"), "").expect("write the node's plugin list");
        let mut rabbit = OwnRabbit {
            port,
            node: format!("babel-idem-{}@localhost", unique_suffix()),
            dir,
            child: None,
        };
        let child = rabbit
            .command("rabbitmq-server")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start rabbitmq-server");
        rabbit.child = Some(child);
        // A node boots in seconds; a loaded machine takes longer.
        let deadline = Instant::now() + STARTUP_LIMIT * 3;
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "rabbitmq-server did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(rabbit)
    }

    /// The node's AMQP URL (guest, the default vhost).
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// One of RabbitMQ's scripts, pointed at this node's files alone.
    fn command(&self, script: &str) -> Command {
        let mut command = Command::new(PathBuf::from(RABBIT_BIN).join(script));
        let dir = &self.dir;
        command
            .env("HOME", dir)
            .env("RABBITMQ_NODENAME", &self.node)
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", free_port().to_string())
            .env("RABBITMQ_CONFIG_FILE", dir.join("rabbit.conf"))
            .env("RABBITMQ_ADVANCED_CONFIG_FILE", dir.join("advanced.config"))
            .env("RABBITMQ_CONF_ENV_FILE", dir.join("rabbitmq-env.conf"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", dir.join("plugins"))
            .env("RABBITMQ_MNESIA_BASE", dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", dir.join("log"))
            .env("RABBITMQ_PID_FILE", dir.join("pid"));
        command
    }
}

impl Drop for OwnRabbit {
    fn drop(&mut self) {
        // The script's child is the Erlang VM: stop the node by name, then
        // reap the script.
        let _ = self
            .command("rabbitmqctl")
            .arg("stop")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
