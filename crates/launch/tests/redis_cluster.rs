//! A Redis Cluster started by plaza-launch: it forms, serves every slot where it says, moves a
//! busy slot without losing a write, and fails a primary over to its replica.
//!
//! The clients here speak RESP on plain connections and follow MOVED and ASK themselves: what
//! is under test is the cluster the launcher made, not a cluster client.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use plaza_launch::{slot_of, ClusterOptions, CpuQuotas, LbKind, LocalCluster, RedisCluster};

/// One RESP reply, arrays excepted (none of the commands used here answers one).
#[derive(Debug, Clone, PartialEq)]
enum Reply {
    Status(String),
    Error(String),
    Int(i64),
    Bulk(Option<String>),
}

impl Reply {
    /// Where a `-MOVED slot addr` or `-ASK slot addr` error points.
    fn redirect(&self, kind: &str) -> Option<(u16, SocketAddr)> {
        let Reply::Error(e) = self else { return None };
        let mut words = e.split(' ');
        (words.next()? == kind).then_some(())?;
        Some((words.next()?.parse().ok()?, words.next()?.parse().ok()?))
    }
}

/// A connection to one server.
struct Conn {
    out: TcpStream,
    input: BufReader<TcpStream>,
}

impl Conn {
    fn open(addr: SocketAddr) -> Conn {
        let out = TcpStream::connect(addr).unwrap();
        out.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let input = BufReader::new(out.try_clone().unwrap());
        Conn { out, input }
    }

    fn send(&mut self, args: &[&str]) {
        let mut req = format!("*{}\r\n", args.len());
        for a in args {
            req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        self.out.write_all(req.as_bytes()).unwrap();
    }

    fn read(&mut self) -> io::Result<Reply> {
        let mut line = String::new();
        if self.input.read_line(&mut line)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let line = line.trim_end_matches("\r\n");
        let (kind, rest) = line.split_at(1);
        Ok(match kind {
            "+" => Reply::Status(rest.to_owned()),
            "-" => Reply::Error(rest.to_owned()),
            ":" => Reply::Int(rest.parse().unwrap()),
            "$" if rest == "-1" => Reply::Bulk(None),
            "$" => {
                let mut buf = vec![0; rest.parse::<usize>().unwrap() + 2];
                io::Read::read_exact(&mut self.input, &mut buf)?;
                buf.truncate(buf.len() - 2);
                Reply::Bulk(Some(String::from_utf8(buf).unwrap()))
            }
            _ => panic!("unexpected reply {line:?}"),
        })
    }

    fn call(&mut self, args: &[&str]) -> Reply {
        self.send(args);
        self.read().unwrap()
    }
}

fn call(addr: SocketAddr, args: &[&str]) -> Reply {
    Conn::open(addr).call(args)
}

fn ok() -> Reply {
    Reply::Status("OK".into())
}

fn bulk(s: &str) -> Reply {
    Reply::Bulk(Some(s.into()))
}

/// Runs a one-key command the way a cluster client does: at the node that serves the key's
/// slot, following MOVED (and remembering it) and ASK (once, with ASKING first), retrying
/// TRYAGAIN. `at` is the node it believes serves the slot.
fn cluster_call(at: &mut SocketAddr, args: &[&str]) -> Reply {
    let mut ask = None;
    for _ in 0..50 {
        let reply = match ask.take() {
            Some(addr) => {
                let mut c = Conn::open(addr);
                c.send(&["ASKING"]);
                c.send(args);
                assert_eq!(c.read().unwrap(), ok(), "ASKING at {addr}");
                c.read().unwrap()
            }
            None => call(*at, args),
        };
        if let Some((_, addr)) = reply.redirect("MOVED") {
            *at = addr;
        } else if let Some((_, addr)) = reply.redirect("ASK") {
            ask = Some(addr);
        } else if matches!(&reply, Reply::Error(e) if e.starts_with("TRYAGAIN")) {
            std::thread::sleep(Duration::from_millis(10));
        } else {
            return reply;
        }
    }
    panic!("{args:?}: still redirected after 50 tries");
}

fn start(dir: &tempfile::TempDir) -> RedisCluster {
    RedisCluster::start(dir.path(), 3).unwrap()
}

#[test]
fn a_cluster_forms_and_serves_each_slot_at_its_primary() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = start(&dir);
    let addrs = cluster.addrs();
    assert_eq!(addrs.len(), 6, "3 primaries and a replica each");
    assert_eq!(cluster.pids().len(), 6);
    let seeds: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
    assert_eq!(
        cluster.seed_url(),
        format!("redis+cluster://{}", seeds.join(","))
    );
    for (i, addr) in addrs.iter().enumerate() {
        let Reply::Bulk(Some(info)) = call(*addr, &["CLUSTER", "INFO"]) else {
            panic!("CLUSTER INFO at {addr}")
        };
        assert!(info.contains("cluster_state:ok"), "{addr}: {info}");
        assert!(info.contains("cluster_known_nodes:6"), "{addr}: {info}");
        let Reply::Bulk(Some(repl)) = call(*addr, &["INFO", "replication"]) else {
            panic!("INFO replication at {addr}")
        };
        if i < 3 {
            assert!(repl.contains("role:master"), "{addr}: {repl}");
            assert!(repl.contains("connected_slaves:1"), "{addr}: {repl}");
        } else {
            assert!(repl.contains("role:slave"), "{addr}: {repl}");
            assert!(repl.contains("master_link_status:up"), "{addr}: {repl}");
            let primary = addrs[i - 3];
            assert!(
                repl.contains(&format!("master_port:{}", primary.port())),
                "{addr} should replicate {primary}: {repl}"
            );
        }
    }
    assert_eq!(cluster.primary_addrs().unwrap(), addrs[..3].to_vec());

    // Keys over every primary: the slot computed here is the server's, the server that owns
    // it is where the launcher says, and any other primary sends the client there.
    let mut served_by = Vec::new();
    for i in 0..30 {
        let key = format!("plaza:{{room-{i}}}:log");
        let slot = slot_of(&key);
        assert_eq!(
            call(addrs[3], &["CLUSTER", "KEYSLOT", &key]),
            Reply::Int(i64::from(slot)),
            "{key}"
        );
        let primary = cluster.primary_of(slot).unwrap();
        let owner = (0..3)
            .find(|&p| cluster.initial_slots(p).unwrap().contains(&slot))
            .unwrap();
        assert_eq!(primary, addrs[owner], "slot {slot}");
        served_by.push(owner);
        assert_eq!(call(primary, &["SET", &key, &format!("v{i}")]), ok());
        assert_eq!(call(primary, &["GET", &key]), bulk(&format!("v{i}")));
        let other = addrs[(owner + 1) % 3];
        assert_eq!(
            call(other, &["GET", &key]).redirect("MOVED"),
            Some((slot, primary)),
            "{key} asked at {other}"
        );
    }
    for p in 0..3 {
        assert!(served_by.contains(&p), "no key landed on primary {p}");
    }
}

#[test]
fn slots_match_cluster_keyslot() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = start(&dir);
    let at = cluster.addrs()[0];
    for key in [
        "foo",
        "123456789",
        "{user1000}.following",
        "{user1000}.followers",
        "foo{}{bar}",
        "foo{{bar}}zap",
        "foo{bar}{zap}",
        "{",
        "}{x}",
        "plaza:room:ümlaut",
    ] {
        assert_eq!(
            call(at, &["CLUSTER", "KEYSLOT", key]),
            Reply::Int(i64::from(slot_of(key))),
            "{key:?}"
        );
    }
    assert_eq!(slot_of("foo"), 12182);
    assert_eq!(slot_of("123456789"), 12739);
}

#[test]
fn primaries_out_of_bounds_are_refused_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    for n in [0, 1, 2, 17] {
        let err = RedisCluster::start(dir.path(), n).err().expect("refused");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{n}: {err}");
        assert!(err.to_string().contains("3 to 16"), "{err}");
    }
    assert!(!dir.path().join("redis-1").exists(), "a server was started");
}

#[test]
fn a_local_cluster_refuses_a_redis_cluster_with_sentinels_embedded_or_a_quota() {
    let dir = tempfile::tempdir().unwrap();
    let opts = ClusterOptions {
        plaza_bin: "/nonexistent/plaza".into(),
        nodes: 1,
        lb: LbKind::Nginx,
        listen_port: 0,
        dir: dir.path().join("cluster"),
        node_args: Vec::new(),
        embedded: false,
        redis_sentinel: false,
        redis_cluster: Some(3),
        cpu_quotas: CpuQuotas::default(),
        lb_workers: None,
        node_ports: None,
    };
    let quota = CpuQuotas {
        redis: Some(0.5),
        ..CpuQuotas::default()
    };
    for bad in [
        ClusterOptions {
            embedded: true,
            ..opts.clone()
        },
        ClusterOptions {
            redis_sentinel: true,
            ..opts.clone()
        },
        ClusterOptions {
            cpu_quotas: quota,
            ..opts.clone()
        },
    ] {
        let err = LocalCluster::start(bad).err().expect("refused");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
    }
    assert!(
        !dir.path().join("cluster").exists(),
        "something was started"
    );
}

/// Writes `n` keys tagged `{tag}` at the slot's primary; returns the slot.
fn fill(cluster: &RedisCluster, tag: &str, n: usize) -> u16 {
    let slot = slot_of(tag);
    let mut at = cluster.primary_of(slot).unwrap();
    for i in 0..n {
        let key = format!("{{{tag}}}:k{i}");
        assert_eq!(cluster_call(&mut at, &["SET", &key, &i.to_string()]), ok());
    }
    slot
}

/// A primary other than the one serving `slot`.
fn another_primary(cluster: &RedisCluster, slot: u16) -> SocketAddr {
    let from = cluster.primary_of(slot).unwrap();
    let to = cluster.primary_addrs().unwrap();
    to.into_iter().find(|p| *p != from).unwrap()
}

#[test]
fn migrate_slot_moves_a_busy_slot_and_loses_no_write() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = start(&dir);
    // More keys than one MIGRATE batch.
    let slot = fill(&cluster, "room-busy", 250);
    let from = cluster.primary_of(slot).unwrap();
    let to = another_primary(&cluster, slot);

    // A client increments a counter of the room all along, as a cluster client would.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut at = from;
            let mut count = 0i64;
            while !stop.load(Ordering::Relaxed) || count < 20 {
                let reply = cluster_call(&mut at, &["INCR", "{room-busy}:seq"]);
                count += 1;
                // One writer: each increment sees exactly the one before it.
                assert_eq!(reply, Reply::Int(count), "increment {count}");
            }
            (count, at)
        })
    };
    let moved = cluster.migrate_slot(slot, to).unwrap();
    stop.store(true, Ordering::Relaxed);
    let (count, writer_at) = writer.join().expect("the writer lost or repeated a write");
    assert_eq!(writer_at, to, "the writer was sent to the new primary");

    assert!(moved >= 250, "{moved} keys moved");
    assert_eq!(cluster.primary_of(slot).unwrap(), to);
    for addr in cluster.addrs() {
        let Reply::Bulk(Some(nodes)) = call(addr, &["CLUSTER", "NODES"]) else {
            panic!("CLUSTER NODES at {addr}")
        };
        assert!(
            !nodes.contains('['),
            "{addr} still shows a migration: {nodes}"
        );
    }
    assert_eq!(
        call(to, &["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()]),
        Reply::Int(251),
        "250 keys and the counter"
    );
    assert_eq!(
        call(from, &["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()]),
        Reply::Int(0)
    );
    for i in [0, 99, 100, 249] {
        let key = format!("{{room-busy}}:k{i}");
        assert_eq!(call(to, &["GET", &key]), bulk(&i.to_string()));
        assert_eq!(
            call(from, &["GET", &key]).redirect("MOVED"),
            Some((slot, to))
        );
    }
    assert_eq!(
        call(to, &["GET", "{room-busy}:seq"]),
        bulk(&count.to_string())
    );
}

#[test]
fn a_slot_held_migrating_sends_new_keys_to_the_target_with_ask() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = start(&dir);
    let slot = fill(&cluster, "room-held", 10);
    let from = cluster.primary_of(slot).unwrap();
    let to = another_primary(&cluster, slot);

    let migration = cluster.begin_migration(slot, to).unwrap();
    assert_eq!(
        (migration.slot(), migration.from(), migration.to()),
        (slot, from, to)
    );
    // Keys it still has, the source serves; a new one it sends to the target, which takes it
    // after ASKING only.
    assert_eq!(call(from, &["GET", "{room-held}:k3"]), bulk("3"));
    let new = "{room-held}:new";
    assert_eq!(
        call(from, &["SET", new, "x"]).redirect("ASK"),
        Some((slot, to))
    );
    assert_eq!(
        call(to, &["SET", new, "x"]).redirect("MOVED"),
        Some((slot, from))
    );
    let mut at = from;
    assert_eq!(cluster_call(&mut at, &["SET", new, "x"]), ok());
    assert_eq!(at, from, "ASK is no MOVED: the source still owns the slot");
    assert_eq!(cluster.primary_of(slot).unwrap(), from);

    let moved = cluster.finish_migration(migration).unwrap();
    assert_eq!(moved, 10, "the new key was at the target already");
    assert_eq!(cluster.primary_of(slot).unwrap(), to);
    assert_eq!(call(to, &["GET", new]), bulk("x"));
    assert_eq!(call(to, &["GET", "{room-held}:k3"]), bulk("3"));

    // A slot its target serves already is not "moved".
    let err = cluster.migrate_slot(slot, to).expect_err("refused");
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
}

#[test]
fn kill_primary_promotes_its_replica_with_the_keys() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = start(&dir);
    let slot = fill(&cluster, "room-failover", 20);
    let old = cluster.primary_of(slot).unwrap();
    let addrs = cluster.addrs();
    let i = addrs.iter().position(|a| *a == old).unwrap();
    assert!(i < 3, "a primary at start");
    // Acknowledged by the replica before the crash: WAIT returns how many replicas have it.
    assert_eq!(call(old, &["WAIT", "1", "5000"]), Reply::Int(1));

    let new = cluster.kill_primary(slot).unwrap();
    assert_eq!(new, addrs[i + 3], "its replica took over");
    assert!(
        cluster.servers()[i].pid().is_none(),
        "the old primary is gone"
    );
    assert_eq!(cluster.pids().len(), 5);
    assert_eq!(cluster.primary_of(slot).unwrap(), new);
    for k in [0, 19] {
        let key = format!("{{room-failover}}:k{k}");
        assert_eq!(call(new, &["GET", &key]), bulk(&k.to_string()));
    }
    // The promoted server takes writes, and the other primaries still serve theirs.
    assert_eq!(call(new, &["SET", "{room-failover}:after", "1"]), ok());
    for p in (0..3).filter(|&p| p != i) {
        let Reply::Bulk(Some(info)) = call(addrs[p], &["CLUSTER", "INFO"]) else {
            panic!("CLUSTER INFO at {}", addrs[p])
        };
        assert!(info.contains("cluster_state:ok"), "{info}");
    }
}
