//! A small routed network of Linux network namespaces for chaos tests, made
//! with the kernel's own tools (`ip`, `iptables`; needs root):
//!
//! ```text
//!   this process (the clients) ── hub (a router) ─┬─ leaf "redis"
//!        10.O.0.1                  10.O.0.2       ├─ leaf "node1"   10.O.k.2
//!                                                 └─ …
//! ```
//!
//! Every leaf is a namespace of its own behind the hub, so its traffic can be
//! cut ([`Lab::cut`]: iptables DROP, as a real partition: nothing answers, no
//! reset) and the path between this process and one leaf degraded
//! ([`Lab::degrade`]: random loss with iptables' `statistic` match and a fixed
//! delay through NFQUEUE, see [`delay`]). Everything is removed when the lab
//! is dropped; namespaces left by a killed test run are removed by the next.

mod delay;

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use plaza_launch::Host;

pub use delay::Delay;

/// Names every namespace of this test process starts with: `plz-<pid>-`.
fn prefix(pid: u32) -> String {
    format!("plz-{pid}-")
}

/// A lab: the hub and its leaves.
pub struct Lab {
    /// Second octet of the lab's 10.O.0.0/16 (also in the root veth's name).
    octet: u8,
    hub: String,
    /// Leaf names and their namespaces, in order (leaf k is 10.O.k.2).
    leaves: Vec<(String, String)>,
    delays: Vec<Delay>,
}

/// Runs a command, failing with its stderr.
fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program}: {e} (scripts/test.sh installs iproute2 and iptables)"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn must(program: &str, args: &[&str]) {
    if let Err(e) = run(program, args) {
        panic!("network lab: {e}");
    }
}

/// `ip [-n NS] ARGS…`, failing the test with what went wrong.
fn ip(ns: Option<&str>, args: &[&str]) {
    let mut all = Vec::with_capacity(args.len() + 2);
    if let Some(ns) = ns {
        all.extend_from_slice(&["-n", ns]);
    }
    all.extend_from_slice(args);
    must("ip", &all);
}

/// Gives `dev` (in namespace `ns`, or this one) the address `cidr` and brings it up.
fn up(ns: Option<&str>, dev: &str, cidr: &str) {
    ip(ns, &["addr", "add", cidr, "dev", dev]);
    ip(ns, &["link", "set", dev, "up"]);
}

/// Removes namespaces left by test processes that no longer run.
fn remove_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        let Some(pid) = name
            .strip_prefix("plz-")
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = run("ip", &["netns", "del", name]);
        }
    }
}

impl Lab {
    /// Builds the hub and one leaf per name. Panics (with what failed) when the
    /// machine does not allow it: not root, no `ip` or `iptables`.
    pub fn new(leaves: &[&str]) -> Lab {
        static LABS: AtomicU32 = AtomicU32::new(0);
        assert!(
            unsafe { libc::geteuid() } == 0,
            "the chaos tests build network namespaces: run them as root (CI does)"
        );
        remove_stale();
        let pid = std::process::id();
        let n = LABS.fetch_add(1, Ordering::Relaxed);
        let hub = format!("{}{n}-hub", prefix(pid));
        must("ip", &["netns", "add", &hub]);
        // The lab's /16: the first octet whose root veth name is free (an
        // atomic claim: the kernel refuses a second link of the same name).
        let start = (pid + n * 37) % 150;
        let octet = (0..150)
            .map(|i| 100 + ((start + i) % 150) as u8)
            .find(|o| {
                run(
                    "ip",
                    &[
                        "link",
                        "add",
                        &format!("pzr{o}"),
                        "type",
                        "veth",
                        "peer",
                        "name",
                        "uplink",
                        "netns",
                        &hub,
                    ],
                )
                .is_ok()
            })
            .expect("a free 10.O.0.0/16 for the lab");
        let mut lab = Lab {
            octet,
            hub: hub.clone(),
            leaves: Vec::new(),
            delays: Vec::new(),
        };
        let hub_ns = Some(hub.as_str());
        up(None, &lab.root_dev(), &format!("10.{octet}.0.1/24"));
        up(hub_ns, "uplink", &format!("10.{octet}.0.2/24"));
        ip(hub_ns, &["link", "set", "lo", "up"]);
        must(
            "ip",
            &[
                "netns",
                "exec",
                &hub,
                "sysctl",
                "-qw",
                "net.ipv4.ip_forward=1",
            ],
        );
        let via = format!("10.{octet}.0.2");
        ip(
            None,
            &["route", "add", &format!("10.{octet}.0.0/16"), "via", &via],
        );
        for (i, name) in leaves.iter().enumerate() {
            let k = i + 1;
            let ns = format!("{}{n}-{name}", prefix(pid));
            must("ip", &["netns", "add", &ns]);
            lab.leaves.push((name.to_string(), ns.clone()));
            let dev = format!("l{k}");
            let peer = [
                "link", "add", &dev, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ];
            ip(hub_ns, &peer);
            up(hub_ns, &dev, &format!("10.{octet}.{k}.1/24"));
            let leaf = Some(ns.as_str());
            up(leaf, "eth0", &format!("10.{octet}.{k}.2/24"));
            ip(leaf, &["link", "set", "lo", "up"]);
            ip(
                leaf,
                &[
                    "route",
                    "add",
                    "default",
                    "via",
                    &format!("10.{octet}.{k}.1"),
                ],
            );
        }
        lab
    }

    fn root_dev(&self) -> String {
        format!("pzr{}", self.octet)
    }

    fn index(&self, leaf: &str) -> usize {
        self.leaves
            .iter()
            .position(|(n, _)| n == leaf)
            .unwrap_or_else(|| panic!("no leaf {leaf} in the lab"))
    }

    fn netns(&self, leaf: &str) -> &str {
        &self.leaves[self.index(leaf)].1
    }

    /// The leaf's address.
    pub fn ip(&self, leaf: &str) -> Ipv4Addr {
        Ipv4Addr::new(10, self.octet, self.index(leaf) as u8 + 1, 2)
    }

    /// Where a process placed on the leaf binds and runs.
    pub fn host(&self, leaf: &str) -> Host {
        Host::in_netns(
            self.ip(leaf),
            PathBuf::from("/var/run/netns").join(self.netns(leaf)),
        )
    }

    fn iptables(&self, ns: &str, rule: &[&str]) {
        let mut args = vec!["netns", "exec", ns, "iptables", "-w"];
        args.extend_from_slice(rule);
        must("ip", &args);
    }

    /// Cuts `leaf` off from the leaf `other`: every packet between them is
    /// dropped silently, as in a real partition.
    pub fn cut(&self, leaf: &str, other: &str) {
        let peer = self.ip(other).to_string();
        let ns = self.netns(leaf).to_owned();
        self.iptables(&ns, &["-I", "INPUT", "-s", &peer, "-j", "DROP"]);
        self.iptables(&ns, &["-I", "OUTPUT", "-d", &peer, "-j", "DROP"]);
    }

    /// Removes every cut made on `leaf`.
    pub fn heal(&self, leaf: &str) {
        let ns = self.netns(leaf).to_owned();
        self.iptables(&ns, &["-F", "INPUT"]);
        self.iptables(&ns, &["-F", "OUTPUT"]);
    }

    /// Degrades the path between this process and `leaf`, in both directions:
    /// each packet is lost with probability `loss` and the others are held
    /// `delay` (on the hub, as a slow link would).
    pub fn degrade(&mut self, leaf: &str, loss: f64, delay: Duration) {
        let queue = self.delays.len() as u16;
        let hub_ns = PathBuf::from("/var/run/netns").join(&self.hub);
        // The queue is read before any packet is sent to it.
        self.delays.push(Delay::start(&hub_ns, queue, delay));
        let dev = format!("l{}", self.index(leaf) + 1);
        let hub = self.hub.clone();
        let queue = queue.to_string();
        let loss = format!("{loss}");
        for (from, to) in [("uplink", dev.as_str()), (dev.as_str(), "uplink")] {
            self.iptables(
                &hub,
                &[
                    "-A",
                    "FORWARD",
                    "-i",
                    from,
                    "-o",
                    to,
                    "-m",
                    "statistic",
                    "--mode",
                    "random",
                    "--probability",
                    &loss,
                    "-j",
                    "DROP",
                ],
            );
            self.iptables(
                &hub,
                &[
                    "-A",
                    "FORWARD",
                    "-i",
                    from,
                    "-o",
                    to,
                    "-j",
                    "NFQUEUE",
                    "--queue-num",
                    &queue,
                ],
            );
        }
    }

    /// Packets the lab's delays held and let through so far.
    pub fn delayed_packets(&self) -> u64 {
        self.delays.iter().map(Delay::packets).sum()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // Rules first: nothing may be queued to a delay that is gone.
        let _ = run(
            "ip",
            &[
                "netns", "exec", &self.hub, "iptables", "-w", "-F", "FORWARD",
            ],
        );
        self.delays.clear();
        for (_, ns) in &self.leaves {
            let _ = run("ip", &["netns", "del", ns]);
        }
        // Deleting the hub deletes the root veth with it, and its route.
        let _ = run("ip", &["netns", "del", &self.hub]);
    }
}
