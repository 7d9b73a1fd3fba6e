//! Issue 37: which embedded store for Plaza's `data_dir`? Measures SQLite (WAL, rusqlite
//! `bundled`), redb and fjall on Plaza's access pattern, every commit fsynced: per-room gap-free
//! logs of ~300-byte entries, a ~100 KB snapshot every 256 entries that deletes the entries it
//! covers, group commit from many producers through one writer, recovery of many rooms, and disk
//! use after each store's compaction.
//!
//! cargo run --release -- <store[,store]|all> <test[,test]|all> [key=value ...]
//!   stores: sqlite redb fjall     tests: append recovery disk
//!   keys: dir=/work/store-compare-tmp reps=3 secs=5 appenders=1,64,1024 (append)
//!         rooms=1000 long_rooms=100 long_entries=10000 (recovery)
//!         disk_rooms=250 cycles=10 (disk)   snap=100000 rec=300 batch=1024

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

mod stores;
use stores::{open_store, Store};

/// Entries between snapshots, as Plaza.
const SNAPSHOT_EVERY: u64 = 256;
/// Appends gathered into one transaction at most, as Plaza's writer.
const GROUP: usize = 1024;

/// One thing a room asks the writer to make durable.
pub enum Op {
    /// A room made with its first state (snapshot at 0).
    Create { room: u32, snap: Vec<u8> },
    Append {
        room: u32,
        n: u64,
        ts: u64,
        payload: Vec<u8>,
    },
    /// The room's state after entry `n`: replaces the snapshot and deletes entries `from..=n`.
    Snapshot {
        room: u32,
        n: u64,
        from: u64,
        snap: Vec<u8>,
    },
}

/// Fixed width, so that byte order is (room, n) order for fjall's keys.
pub fn room_id(room: u32) -> String {
    format!("room-{room:06}")
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// JSON-looking bytes of about `len`, with random ids and numbers so that it compresses roughly
/// like real JSON (not like zeros, not like random bytes).
fn json_like(rng: &mut Rng, len: usize) -> Vec<u8> {
    let mut s = String::with_capacity(len + 128);
    s.push('[');
    while s.len() < len {
        let (a, b) = (rng.next(), rng.next());
        s.push_str(&format!(
            "{{\"type\":\"move\",\"member\":\"m{:08x}\",\"x\":{},\"y\":{},\"seq\":{},\"tag\":\"{:012x}\"}},",
            a as u32,
            (a >> 32) % 100_000,
            b % 100_000,
            b >> 40,
            rng.next() & 0xffff_ffff_ffff
        ));
    }
    s.pop();
    s.push(']');
    s.into_bytes()
}

/// Pre-made entry and snapshot bodies (so producers spend no CPU making them), picked at random.
struct Bodies {
    recs: Vec<Vec<u8>>,
    snaps: Vec<Vec<u8>>,
}

impl Bodies {
    fn new(rec: usize, snap: usize) -> Bodies {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        Bodies {
            recs: (0..4096).map(|_| json_like(&mut rng, rec)).collect(),
            snaps: (0..64).map(|_| json_like(&mut rng, snap)).collect(),
        }
    }
    fn rec(&self, rng: &mut Rng) -> Vec<u8> {
        self.recs[rng.next() as usize % self.recs.len()].clone()
    }
    fn snap(&self, rng: &mut Rng) -> Vec<u8> {
        self.snaps[rng.next() as usize % self.snaps.len()].clone()
    }
}

/// Allocated blocks, what `du` shows.
fn dir_size(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
        match e.metadata() {
            Ok(m) if m.is_dir() => total += dir_size(&e.path()),
            Ok(m) => total += m.blocks() * 512,
            Err(_) => {}
        }
    }
    total
}

/// Files over 1 MB under `p` (stderr): what is left after compaction.
fn big_files(p: &Path) {
    use std::os::unix::fs::MetadataExt;
    for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
        match e.metadata() {
            Ok(m) if m.is_dir() => big_files(&e.path()),
            Ok(m) if m.blocks() * 512 > 1_000_000 => {
                eprintln!(
                    "  {:.1} MB {}",
                    (m.blocks() * 512) as f64 / 1e6,
                    e.path().display()
                )
            }
            _ => {}
        }
    }
}

/// Evicts this directory's files from the page cache (only ours: no global drop_caches).
fn evict(p: &Path) {
    use std::os::unix::io::AsRawFd;
    for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
        let path = e.path();
        if path.is_dir() {
            evict(&path);
        } else if let Ok(f) = std::fs::File::open(&path) {
            let _ = f.sync_all();
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
    }
}

fn fresh_dir(cfg: &Cfg, name: &str) -> PathBuf {
    let dir = cfg.dir.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// "median (min–max)"
fn med_range(v: &[f64]) -> String {
    let mut v = v.to_vec();
    let m = percentile(&mut v, 0.5);
    let (lo, hi) = (v[0], v[v.len() - 1]);
    if v.len() == 1 {
        return fmt(m);
    }
    format!("{} ({}–{})", fmt(m), fmt(lo), fmt(hi))
}

fn fmt(x: f64) -> String {
    match x {
        x if x >= 100.0 => format!("{x:.0}"),
        x if x >= 10.0 => format!("{x:.1}"),
        x => format!("{x:.2}"),
    }
}

struct Cfg {
    dir: PathBuf,
    reps: usize,
    secs: f64,
    appenders: Vec<u32>,
    rooms: u32,
    long_rooms: u32,
    long_entries: u64,
    disk_rooms: u32,
    cycles: u64,
    batch: usize,
    bodies: Arc<Bodies>,
}

// ---------------------------------------------------------------- (a) append with group commit

struct AppendResult {
    appends_per_s: f64,
    commits_per_s: f64,
    ops_per_commit: f64,
    ack_p50: f64,
    ack_p99: f64,
    commit_p50: f64,
    commit_p99: f64,
}

/// `appenders` producers, one room each, each waiting for its append's acknowledgement before
/// the next (and every 256th entry for its snapshot); one writer thread gathers whatever is
/// waiting, up to 1024, into one durable commit and then acknowledges: Plaza's `write_loop`.
fn run_append(cfg: &Cfg, kind: &str, appenders: u32, bodies: &Arc<Bodies>) -> AppendResult {
    let dir = fresh_dir(cfg, &format!("append-{kind}"));
    let mut store = open_store(kind, &dir);
    let mut rng = Rng(1);
    let creates: Vec<Op> = (0..appenders)
        .map(|room| Op::Create {
            room,
            snap: bodies.snap(&mut rng),
        })
        .collect();
    store.commit(&creates);

    let (tx, rx) = mpsc::channel::<(Op, mpsc::SyncSender<()>)>();
    let stop = Arc::new(AtomicBool::new(false));
    let producers: Vec<_> = (0..appenders)
        .map(|room| {
            let (tx, stop, bodies) = (tx.clone(), stop.clone(), bodies.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(0x5DEE_CE66_D1CE_4E5B ^ (room as u64 + 1));
                let (ack_tx, ack) = mpsc::sync_channel(1);
                let (mut n, mut acks) = (0u64, Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let t = Instant::now();
                    let payload = bodies.rec(&mut rng);
                    tx.send((
                        Op::Append {
                            room,
                            n,
                            ts: n,
                            payload,
                        },
                        ack_tx.clone(),
                    ))
                    .unwrap();
                    ack.recv().unwrap();
                    acks.push(t.elapsed().as_secs_f64() * 1e3);
                    if n % SNAPSHOT_EVERY == 0 {
                        let snap = bodies.snap(&mut rng);
                        let from = n - SNAPSHOT_EVERY + 1;
                        tx.send((
                            Op::Snapshot {
                                room,
                                n,
                                from,
                                snap,
                            },
                            ack_tx.clone(),
                        ))
                        .unwrap();
                        ack.recv().unwrap();
                    }
                }
                (n, acks)
            })
        })
        .collect();
    drop(tx);
    let t0 = Instant::now();
    let writer = std::thread::spawn(move || {
        let (mut batch, mut waiters, mut commits) = (Vec::new(), Vec::new(), Vec::new());
        while let Ok((op, w)) = rx.recv() {
            batch.push(op);
            waiters.push(w);
            while batch.len() < GROUP {
                match rx.try_recv() {
                    Ok((op, w)) => {
                        batch.push(op);
                        waiters.push(w);
                    }
                    Err(_) => break,
                }
            }
            let t = Instant::now();
            store.commit(&batch);
            commits.push((t.elapsed().as_secs_f64() * 1e3, batch.len()));
            for w in waiters.drain(..) {
                let _ = w.send(());
            }
            batch.clear();
        }
        commits
    });
    std::thread::sleep(Duration::from_secs_f64(cfg.secs));
    stop.store(true, Ordering::Relaxed);
    let (mut appends, mut acks) = (0u64, Vec::new());
    for p in producers {
        let (n, a) = p.join().unwrap();
        appends += n;
        acks.extend(a);
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let commits = writer.join().unwrap();
    let ops: usize = commits.iter().map(|c| c.1).sum();
    let mut commit_ms: Vec<f64> = commits.iter().map(|c| c.0).collect();
    let _ = std::fs::remove_dir_all(&dir);
    AppendResult {
        appends_per_s: appends as f64 / elapsed,
        commits_per_s: commits.len() as f64 / elapsed,
        ops_per_commit: ops as f64 / commits.len() as f64,
        ack_p50: percentile(&mut acks, 0.5),
        ack_p99: percentile(&mut acks, 0.99),
        commit_p50: percentile(&mut commit_ms, 0.5),
        commit_p99: percentile(&mut commit_ms, 0.99),
    }
}

// ---------------------------------------------------------------- histories (recovery, disk)

/// What a written history left live: payload bytes of the latest snapshots and the log tails.
struct Written {
    live: u64,
    entries: u64,
    secs: f64,
}

/// Writes rooms' histories as Plaza would: every room created with a small first state, then
/// all rooms advancing together, `lens[room]` entries each, with (when `snapshots`) a snapshot
/// every 256 entries that deletes the ones it covers; `batch` operations per durable commit.
/// `after_commit` is called after each commit.
fn write_history(
    store: &mut dyn Store,
    cfg: &Cfg,
    lens: &[u64],
    snapshots: bool,
    after_commit: &mut dyn FnMut(),
) -> Written {
    let t = Instant::now();
    let mut rng = Rng(7);
    let mut ops = Vec::new();
    let (mut snap_len, mut tail) = (vec![0u64; lens.len()], vec![(0u64, 0u64); lens.len()]);
    for room in 0..lens.len() as u32 {
        let snap = json_like(&mut rng, 1000);
        snap_len[room as usize] = snap.len() as u64;
        ops.push(Op::Create { room, snap });
    }
    let max = lens.iter().copied().max().unwrap_or(0);
    for n in 1..=max {
        for (room, _) in lens.iter().enumerate().filter(|(_, len)| **len >= n) {
            let payload = cfg.bodies.rec(&mut rng);
            tail[room].0 += 1;
            tail[room].1 += payload.len() as u64;
            ops.push(Op::Append {
                room: room as u32,
                n,
                ts: n,
                payload,
            });
            if snapshots && n % SNAPSHOT_EVERY == 0 {
                let snap = cfg.bodies.snap(&mut rng);
                snap_len[room] = snap.len() as u64;
                tail[room] = (0, 0);
                let from = n - SNAPSHOT_EVERY + 1;
                ops.push(Op::Snapshot {
                    room: room as u32,
                    n,
                    from,
                    snap,
                });
            }
            if ops.len() >= cfg.batch {
                store.commit(&ops);
                ops.clear();
                after_commit();
            }
        }
    }
    store.commit(&ops);
    after_commit();
    Written {
        live: snap_len.iter().sum::<u64>() + tail.iter().map(|t| t.1).sum::<u64>(),
        entries: tail.iter().map(|t| t.0).sum(),
        secs: t.elapsed().as_secs_f64(),
    }
}

// ---------------------------------------------------------------- (b) recovery

/// Open + load every room's snapshot and log into memory; checks what came back.
fn recover(dir: &Path, kind: &str, want: &Written, rooms: usize, cold: bool) -> f64 {
    if cold {
        evict(dir);
    }
    let t = Instant::now();
    let store = open_store(kind, dir);
    let loaded = store.load();
    let secs = t.elapsed().as_secs_f64();
    let entries: u64 = loaded.values().map(|r| r.log.len() as u64).sum();
    let live: u64 = loaded
        .values()
        .map(|r| r.snap.len() as u64 + r.log.iter().map(|e| e.2.len() as u64).sum::<u64>())
        .sum();
    assert_eq!(
        (loaded.len(), entries, live),
        (rooms, want.entries, want.live),
        "{kind}"
    );
    secs
}

fn run_recovery(cfg: &Cfg, stores: &[&str]) {
    let mut rng = Rng(42);
    // a full history's snapshot plus 0..=255 entries after it, 1..4 snapshots taken so far
    let snapped: Vec<u64> = (0..cfg.rooms)
        .map(|_| SNAPSHOT_EVERY * (1 + rng.next() % 4) + rng.next() % SNAPSHOT_EVERY)
        .collect();
    let long = vec![cfg.long_entries; cfg.long_rooms as usize];
    let cases = [
        (
            format!("{} rooms, snapshot + ≤255 entries", cfg.rooms),
            snapped,
            true,
        ),
        (
            format!(
                "{} rooms × {} entries, no snapshot",
                cfg.long_rooms, cfg.long_entries
            ),
            long,
            false,
        ),
    ];
    for (name, lens, snapshots) in &cases {
        let mut written = Vec::new();
        println!("\n### recovery: {name}");
        for s in stores {
            let dir = fresh_dir(cfg, &format!("recovery-{s}"));
            let mut store = open_store(s, &dir);
            let w = write_history(store.as_mut(), cfg, lens, *snapshots, &mut || {});
            drop(store);
            println!(
                "- {s}: wrote {:.1} MB live ({} log entries) in {:.1} s; {:.1} MB on disk",
                w.live as f64 / 1e6,
                w.entries,
                w.secs,
                dir_size(&dir) as f64 / 1e6
            );
            written.push((*s, dir, w));
        }
        let mut res: HashMap<(&str, bool), Vec<f64>> = HashMap::new();
        for rep in 0..cfg.reps {
            for cold in [true, false] {
                for (s, dir, w) in &written {
                    let secs = recover(dir, s, w, lens.len(), cold);
                    eprintln!("recovery {name} cold={cold} rep {rep} {s}: {secs:.3} s");
                    res.entry((s, cold)).or_default().push(secs * 1e3);
                }
            }
        }
        println!("\n| store | on disk MB | cold ms | warm ms |");
        println!("|---|---|---|---|");
        for (s, dir, _) in &written {
            println!(
                "| {s} | {:.1} | {} | {} |",
                dir_size(dir) as f64 / 1e6,
                med_range(&res[&(*s, true)]),
                med_range(&res[&(*s, false)])
            );
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

// ---------------------------------------------------------------- (c) disk after compaction

struct DiskResult {
    live: u64,
    peak: u64,
    before: u64,
    after: u64,
    compact_s: f64,
    write_s: f64,
}

fn run_disk(cfg: &Cfg, kind: &str) -> DiskResult {
    let dir = fresh_dir(cfg, &format!("disk-{kind}"));
    let mut store = open_store(kind, &dir);
    let mut rng = Rng(9);
    // `cycles` snapshots per room, then a tail of 0..=255 entries
    let lens: Vec<u64> = (0..cfg.disk_rooms)
        .map(|_| cfg.cycles * SNAPSHOT_EVERY + rng.next() % SNAPSHOT_EVERY)
        .collect();
    let (mut peak, mut commits) = (0, 0u64);
    let w = write_history(store.as_mut(), cfg, &lens, true, &mut || {
        commits += 1;
        if commits % 50 == 0 {
            peak = dir_size(&dir).max(peak);
        }
    });
    let before = dir_size(&dir);
    let t = Instant::now();
    store.compact();
    let compact_s = t.elapsed().as_secs_f64();
    drop(store);
    let after = dir_size(&dir);
    eprintln!("disk {kind}: after compaction");
    big_files(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    DiskResult {
        live: w.live,
        peak: peak.max(before),
        before,
        after,
        compact_s,
        write_s: w.secs,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let which = args.first().map_or("all", |s| s.as_str());
    let tests = args.get(1).map_or("all", |s| s.as_str());
    let kv: HashMap<&str, &str> = args
        .iter()
        .skip(2)
        .filter_map(|a| a.split_once('='))
        .collect();
    let get = |k: &str, d: &str| kv.get(k).copied().unwrap_or(d).to_owned();
    let num = |k: &str, d: &str| get(k, d).parse::<f64>().unwrap();
    let snap = num("snap", "100000") as usize;
    let rec = num("rec", "300") as usize;
    let cfg = Cfg {
        dir: PathBuf::from(get("dir", "/work/store-compare-tmp")),
        reps: num("reps", "3") as usize,
        secs: num("secs", "5"),
        appenders: get("appenders", "1,64,1024")
            .split(',')
            .map(|a| a.parse().unwrap())
            .collect(),
        rooms: num("rooms", "1000") as u32,
        long_rooms: num("long_rooms", "100") as u32,
        long_entries: num("long_entries", "10000") as u64,
        disk_rooms: num("disk_rooms", "250") as u32,
        cycles: num("cycles", "10") as u64,
        batch: num("batch", "1024") as usize,
        bodies: Arc::new(Bodies::new(rec, snap)),
    };
    std::fs::create_dir_all(&cfg.dir).unwrap();
    let stores: Vec<&str> = match which {
        "all" => vec!["sqlite", "redb", "fjall"],
        s => s.split(',').collect(),
    };
    let run = |t: &str| tests == "all" || tests.split(',').any(|x| x == t);

    if run("append") {
        let mut res: HashMap<(&str, u32), Vec<AppendResult>> = HashMap::new();
        for rep in 0..cfg.reps {
            for &a in &cfg.appenders {
                for s in &stores {
                    let r = run_append(&cfg, s, a, &cfg.bodies);
                    eprintln!(
                        "append rep {rep} {s} x{a}: {:.0} appends/s, {:.0} commits/s, {:.1} ops/commit, ack p50 {:.2} p99 {:.2} ms, commit p50 {:.2} p99 {:.2} ms",
                        r.appends_per_s, r.commits_per_s, r.ops_per_commit, r.ack_p50, r.ack_p99, r.commit_p50, r.commit_p99
                    );
                    res.entry((s, a)).or_default().push(r);
                }
            }
        }
        println!(
            "\n### append, fsync on every commit ({} s per run, {} runs: median (min–max))",
            cfg.secs, cfg.reps
        );
        println!("| appenders | store | appends/s | commits/s | ops per commit | ack p50 ms | ack p99 ms | commit p50 ms | commit p99 ms |");
        println!("|---|---|---|---|---|---|---|---|---|");
        for &a in &cfg.appenders {
            for s in &stores {
                let v = &res[&(*s, a)];
                let col =
                    |f: fn(&AppendResult) -> f64| med_range(&v.iter().map(f).collect::<Vec<_>>());
                println!(
                    "| {a} | {s} | {} | {} | {} | {} | {} | {} | {} |",
                    col(|r| r.appends_per_s),
                    col(|r| r.commits_per_s),
                    col(|r| r.ops_per_commit),
                    col(|r| r.ack_p50),
                    col(|r| r.ack_p99),
                    col(|r| r.commit_p50),
                    col(|r| r.commit_p99)
                );
            }
        }
    }

    if run("recovery") {
        run_recovery(&cfg, &stores);
    }

    if run("disk") {
        println!("\n### disk: {} rooms × {} snapshots + ≤255 entries (MB = 10^6 bytes, allocated blocks)", cfg.disk_rooms, cfg.cycles);
        println!("| store | live MB | peak MB | before compaction MB | after compaction MB | after / live | compaction s | write s |");
        println!("|---|---|---|---|---|---|---|---|");
        for s in &stores {
            let r = run_disk(&cfg, s);
            let mb = |b: u64| b as f64 / 1e6;
            println!(
                "| {s} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} | {:.1} |",
                mb(r.live),
                mb(r.peak),
                mb(r.before),
                mb(r.after),
                r.after as f64 / r.live as f64,
                r.compact_s,
                r.write_s
            );
        }
    }
}
