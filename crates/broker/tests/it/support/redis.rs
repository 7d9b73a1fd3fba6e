//! A throwaway `redis-server` on a free loopback port, in a temporary
//! directory, with an append-only file so its data survives a restart.
//! Never an existing Redis of the machine.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::Duration;

/// How long Redis may take to say it is ready.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A running (or stopped) test Redis. Killed and its directory removed on drop.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
}

impl RedisServer {
    /// Starts a fresh server.
    pub fn start() -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "plaza-broker-redis-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the test redis directory");
        let mut server = Self {
            child: None,
            port: free_port(),
            dir,
        };
        // The free port may be taken by another test before redis binds it:
        // then another port is tried.
        for attempt in 1.. {
            match server.try_launch() {
                Ok(()) => break,
                Err(log) if log.contains("Address already in use") && attempt < 5 => {
                    server.port = free_port();
                }
                Err(log) => panic!("redis-server exited before it was ready:\n{log}"),
            }
        }
        server
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops it as an operator would (SIGTERM: it writes its append-only
    /// file and exits) and waits until it has exited.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM redis-server failed");
        child.wait().expect("wait for redis-server to exit");
    }

    /// Freezes it (SIGSTOP): connections stay open, nothing is answered, as
    /// with a hung server or a network that drops packets.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("redis-server is running");
        let status = Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} redis-server failed");
    }

    /// Starts it again on the same port with the same directory (and so the
    /// same data).
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    fn launch(&mut self) {
        if let Err(log) = self.try_launch() {
            panic!("redis-server exited before it was ready:\n{log}");
        }
    }

    /// Starts redis-server on `self.port`; the log if it exits before it is ready.
    fn try_launch(&mut self) -> Result<(), String> {
        let binary = binary();
        let mut child = Command::new(&binary)
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(&self.dir)
            .args(["--appendonly", "yes", "--save", "", "--daemonize", "no"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", binary.display()));
        let stdout = child.stdout.take().expect("redis-server stdout");
        let (ready_tx, ready_rx) = mpsc::channel();
        // Reads the log until the end: a full pipe would block the server.
        std::thread::spawn(move || {
            let mut log = Vec::new();
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.contains("Ready to accept connections") {
                    let _ = ready_tx.send(Ok(()));
                }
                log.push(line);
            }
            let _ = ready_tx.send(Err(log.join("\n")));
        });
        match ready_rx.recv_timeout(START_TIMEOUT) {
            Ok(Ok(())) => {
                self.child = Some(child);
                Ok(())
            }
            Ok(Err(log)) => {
                let _ = child.wait();
                Err(log)
            }
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("redis-server was not ready within {START_TIMEOUT:?}");
            }
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGKILL works on a paused server too.
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `redis-server` from `$REDIS_SERVER`, /usr/bin or the PATH.
fn binary() -> PathBuf {
    let candidates = std::env::var_os("REDIS_SERVER")
        .map(PathBuf::from)
        .into_iter()
        .chain([PathBuf::from("/usr/bin/redis-server")])
        .chain(std::env::var_os("PATH").into_iter().flat_map(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join("redis-server"))
                .collect::<Vec<_>>()
        }));
    for candidate in candidates {
        if Path::new(&candidate).is_file() {
            return candidate;
        }
    }
    panic!(
        "redis-server is not installed; run scripts/test.sh, which installs it \
         (or `apt-get install redis-server`)"
    );
}

/// A loopback port nothing listens on now.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local address").port()
}
