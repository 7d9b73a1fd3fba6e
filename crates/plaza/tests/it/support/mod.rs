//! Starting the real `plaza serve` for tests of the binary.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// A running `plaza serve`, killed when dropped.
pub struct Plaza {
    pub child: Child,
    pub addr: String,
}

impl Drop for Plaza {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits for `child` to exit, at most `limit` (`what` says why it should).
/// Polled: std offers no awaitable exit, and reaping it behind `Child`'s back
/// would leave `Child` to kill a pid that may be reused.
pub async fn exit_within(
    child: &mut Child,
    limit: std::time::Duration,
    what: &str,
) -> std::process::ExitStatus {
    let started = std::time::Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(started.elapsed() < limit, "plaza did not exit {what}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Starts `plaza serve` on an ephemeral port and reads the address it prints.
pub fn start(args: &[&str], envs: &[(&str, &str)]) -> Plaza {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_plaza"));
    cmd.arg("serve")
        .arg("--listen")
        .arg("127.0.0.1:0")
        .args(args);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_owned();
    Plaza { child, addr }
}

/// A minimal HTTP/1.1 GET over a TcpStream; returns the whole response.
pub fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// A minimal HTTP/1.1 POST over a TcpStream (no client library needed for one call).
pub fn http_post(addr: &str, path: &str, body: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}
