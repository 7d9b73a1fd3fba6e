//! Issue 37: which embedded store for Plaza's `data_dir`? Measures SQLite (WAL, rusqlite
//! `bundled`), redb and fjall on Plaza's access pattern: per-room gap-free logs of ~300-byte
//! records, a ~100 KB snapshot every 256 entries followed by a trim, group commit from many
//! rooms, recovery of many rooms, and disk use after compaction.
//!
//! cargo run --release --manifest-path bench/store-compare/Cargo.toml -- <store|all> <test|all> [key=value ...]
//!   stores: sqlite redb fjall     tests: append recovery disk
//!   keys: dir=PATH (default /work/store-compare-tmp) reps=3 secs=5 rooms=64 (append)
//!         rrooms=1000 (recovery) drooms=250 cycles=10 (disk) snap=100000 rec=300

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod stores;
use stores::{open_store, Sync};

/// One thing a room asks the writer to make durable.
pub enum Op {
    Append { room: u64, n: u64, body: Vec<u8> },
    /// Latest snapshot at position `pos`; log entries `trim_from..=pos` are deleted with it.
    Snapshot { room: u64, pos: u64, trim_from: u64, body: Vec<u8> },
}

pub struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// JSON-looking bytes of about `len`: a command or a room state, with random ids and numbers so
/// that it compresses roughly like real JSON (not like zeros, not like random bytes).
pub fn json_like(rng: &mut Rng, len: usize) -> Vec<u8> {
    let mut s = String::with_capacity(len + 128);
    s.push('[');
    while s.len() < len {
        let a = rng.next();
        let b = rng.next();
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

fn dir_size(p: &Path) -> u64 {
    let mut total = 0;
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            let md = match e.metadata() { Ok(m) => m, Err(_) => continue };
            if md.is_dir() {
                total += dir_size(&e.path());
            } else {
                // allocated blocks, what `du` shows (sparse/preallocated files count as used)
                use std::os::unix::fs::MetadataExt;
                total += md.blocks() * 512;
            }
        }
    }
    total
}

/// Evict this directory's files from the page cache (only ours: no global drop_caches).
fn evict(p: &Path) {
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            let path = e.path();
            if path.is_dir() {
                evict(&path);
            } else if let Ok(f) = std::fs::File::open(&path) {
                use std::os::unix::io::AsRawFd;
                let _ = f.sync_all();
                unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            }
        }
    }
}

struct Cfg {
    dir: PathBuf,
    reps: usize,
    secs: f64,
    rooms: u64,
    rrooms: u64,
    drooms: u64,
    cycles: u64,
    snap: usize,
    rec: usize,
    max_batch: usize,
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn med_range(v: &[f64]) -> String {
    let mut v = v.to_vec();
    let m = percentile(&mut v, 0.5);
    let lo = v.first().copied().unwrap_or(0.0);
    let hi = v.last().copied().unwrap_or(0.0);
    format!("{} ({}–{})", fmt(m), fmt(lo), fmt(hi))
}

fn fmt(x: f64) -> String {
    if x >= 100.0 { format!("{:.0}", x) } else if x >= 10.0 { format!("{:.1}", x) } else { format!("{:.2}", x) }
}

// ---------------------------------------------------------------- (1) append with group commit

struct AppendResult {
    appends_per_s: f64,
    snapshots: u64,
    commits_per_s: f64,
    mean_batch: f64,
    p50_ms: f64,
    p99_ms: f64,
}

fn run_append(cfg: &Cfg, kind: &str, sync: Sync) -> AppendResult {
    let dir = cfg.dir.join(format!("append-{kind}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut store = open_store(kind, &dir, sync);
    let (tx, rx) = mpsc::channel::<(Op, mpsc::SyncSender<()>)>();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut handles = Vec::new();
    let secs = cfg.secs;
    for room in 0..cfg.rooms {
        let tx = tx.clone();
        let stop = stop.clone();
        let (snap, rec) = (cfg.snap, cfg.rec);
        handles.push(std::thread::spawn(move || {
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (room + 1));
            let (wtx, wrx) = mpsc::sync_channel(1);
            let mut lat = Vec::with_capacity(100_000);
            let (mut n, mut snaps, mut last_snap) = (0u64, 0u64, 0u64);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                n += 1;
                let t = Instant::now();
                tx.send((Op::Append { room, n, body: json_like(&mut rng, rec) }, wtx.clone())).unwrap();
                wrx.recv().unwrap();
                lat.push(t.elapsed().as_secs_f64() * 1e3);
                if n % 256 == 0 {
                    tx.send((Op::Snapshot { room, pos: n, trim_from: last_snap + 1, body: json_like(&mut rng, snap) }, wtx.clone())).unwrap();
                    wrx.recv().unwrap();
                    last_snap = n;
                    snaps += 1;
                }
            }
            (n, snaps, lat)
        }));
    }
    drop(tx);
    let t0 = Instant::now();
    let writer = std::thread::spawn(move || {
        let (mut commits, mut last_sync) = (0u64, Instant::now());
        let mut batch = Vec::new();
        let mut waiters = Vec::new();
        while let Ok(first) = rx.recv() {
            batch.push(first.0);
            waiters.push(first.1);
            // group commit: take whatever else is already pending (no waiting)
            while batch.len() < 1024 {
                match rx.try_recv() {
                    Ok((op, w)) => { batch.push(op); waiters.push(w); }
                    Err(_) => break,
                }
            }
            store.commit(&batch);
            commits += 1;
            for w in waiters.drain(..) { let _ = w.send(()); }
            batch.clear();
            if sync == Sync::Interval && last_sync.elapsed() >= Duration::from_secs(1) {
                store.sync_now();
                last_sync = Instant::now();
            }
        }
        (commits, store)
    });
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut appends, mut snaps, mut lat) = (0u64, 0u64, Vec::new());
    for h in handles {
        let (n, s, l) = h.join().unwrap();
        appends += n;
        snaps += s;
        lat.extend(l);
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let (commits, store) = writer.join().unwrap();
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
    let ops = appends + snaps;
    AppendResult {
        appends_per_s: appends as f64 / elapsed,
        snapshots: snaps,
        commits_per_s: commits as f64 / elapsed,
        mean_batch: ops as f64 / commits as f64,
        p50_ms: percentile(&mut lat, 0.5),
        p99_ms: percentile(&mut lat, 0.99),
    }
}

// ---------------------------------------------------------------- (2) recovery

fn populate_recovery(cfg: &Cfg, kind: &str) -> (PathBuf, f64, u64, u64) {
    let dir = cfg.dir.join(format!("recovery-{kind}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let t = Instant::now();
    let mut store = open_store(kind, &dir, Sync::Interval);
    let mut rng = Rng(42);
    let mut live = 0u64;
    let mut entries = 0u64;
    // 10 rooms per transaction: ~1.4 MB each
    for chunk in 0..cfg.rrooms.div_ceil(10) {
        let mut ops = Vec::new();
        for room in chunk * 10..((chunk + 1) * 10).min(cfg.rrooms) {
            let pos = 256 * (1 + rng.next() % 4);
            let body = json_like(&mut rng, cfg.snap);
            live += body.len() as u64;
            ops.push(Op::Snapshot { room, pos, trim_from: pos + 1, body });
            let tail = rng.next() % 256; // 0..=255
            for n in pos + 1..=pos + tail {
                let body = json_like(&mut rng, cfg.rec);
                live += body.len() as u64;
                entries += 1;
                ops.push(Op::Append { room, n, body });
            }
        }
        store.commit(&ops);
    }
    store.sync_now();
    drop(store);
    (dir, t.elapsed().as_secs_f64(), live, entries)
}

fn run_recovery(dir: &Path, kind: &str, rooms: u64, cold: bool) -> (f64, u64, u64) {
    if cold {
        evict(dir);
    }
    let t = Instant::now();
    let store = open_store(kind, dir, Sync::Interval);
    let t_open = t.elapsed();
    let _ = t_open;
    let (bytes, entries, seen) = store.recover_all();
    let el = t.elapsed().as_secs_f64();
    assert_eq!(seen, rooms, "{kind}: rooms recovered");
    drop(store);
    (el, bytes, entries)
}

// ---------------------------------------------------------------- (3) disk after compaction

struct DiskResult {
    write_s: f64,
    peak: u64,
    before: u64,
    after: u64,
    compact_s: f64,
    live: u64,
}

fn run_disk(cfg: &Cfg, kind: &str) -> DiskResult {
    let dir = cfg.dir.join(format!("disk-{kind}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut store = open_store(kind, &dir, Sync::Interval);
    let mut rng = Rng(7);
    let t = Instant::now();
    let mut peak = 0;
    let mut last_snap: HashMap<u64, u64> = HashMap::new();
    let mut n = 0u64;
    let mut live_snap: HashMap<u64, u64> = HashMap::new();
    // rooms advance together; each commit = 64 appends (one each for 64 rooms) as group commit would
    let mut ops = Vec::new();
    for cycle in 0..cfg.cycles {
        for _ in 0..256 {
            n += 1;
            for room in 0..cfg.drooms {
                ops.push(Op::Append { room, n, body: json_like(&mut rng, cfg.rec) });
                if ops.len() == 64 {
                    store.commit(&ops);
                    ops.clear();
                }
            }
        }
        for room in 0..cfg.drooms {
            let from = last_snap.get(&room).copied().unwrap_or(0) + 1;
            let body = json_like(&mut rng, cfg.snap);
            live_snap.insert(room, body.len() as u64);
            ops.push(Op::Snapshot { room, pos: n, trim_from: from, body });
            store.commit(&ops);
            ops.clear();
            last_snap.insert(room, n);
        }
        store.sync_now();
        peak = peak.max(dir_size(&dir));
        eprintln!("  {kind} disk: cycle {} of {}, dir {} MB", cycle + 1, cfg.cycles, dir_size(&dir) / 1_000_000);
    }
    let write_s = t.elapsed().as_secs_f64();
    let before = dir_size(&dir);
    let t = Instant::now();
    store.compact();
    let compact_s = t.elapsed().as_secs_f64();
    drop(store);
    let after = dir_size(&dir);
    let live: u64 = live_snap.values().sum();
    let _ = std::fs::remove_dir_all(&dir);
    DiskResult { write_s, peak: peak.max(before), before, after, compact_s, live }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let which = args.first().cloned().unwrap_or_else(|| "all".into());
    let test = args.get(1).cloned().unwrap_or_else(|| "all".into());
    let mut kv: HashMap<String, String> = HashMap::new();
    for a in args.iter().skip(2) {
        if let Some((k, v)) = a.split_once('=') {
            kv.insert(k.into(), v.into());
        }
    }
    let g = |k: &str, d: &str| kv.get(k).cloned().unwrap_or_else(|| d.into());
    let cfg = Cfg {
        dir: PathBuf::from(g("dir", "/work/store-compare-tmp")),
        reps: g("reps", "3").parse().unwrap(),
        secs: g("secs", "5").parse().unwrap(),
        rooms: g("rooms", "64").parse().unwrap(),
        rrooms: g("rrooms", "1000").parse().unwrap(),
        drooms: g("drooms", "250").parse().unwrap(),
        cycles: g("cycles", "10").parse().unwrap(),
        snap: g("snap", "100000").parse().unwrap(),
        rec: g("rec", "300").parse().unwrap(),
        max_batch: 1024,
    };
    let _ = cfg.max_batch;
    std::fs::create_dir_all(&cfg.dir).unwrap();
    let stores: Vec<&str> = if which == "all" { vec!["sqlite", "redb", "fjall"] } else { which.split(',').collect() };
    let run = |t: &str| test == "all" || test.split(',').any(|x| x == t);

    if run("append") {
        for sync in [Sync::Durable, Sync::Interval] {
            let mut res: HashMap<&str, Vec<AppendResult>> = HashMap::new();
            for rep in 0..cfg.reps {
                for s in &stores {
                    let r = run_append(&cfg, s, sync);
                    eprintln!("append {sync:?} rep {rep} {s}: {:.0} appends/s, {:.0} commits/s, batch {:.1}, p50 {:.2} ms, p99 {:.2} ms, {} snapshots",
                        r.appends_per_s, r.commits_per_s, r.mean_batch, r.p50_ms, r.p99_ms, r.snapshots);
                    res.entry(s).or_default().push(r);
                }
            }
            println!("\n## append, {:?} ({} rooms, {} s, {} runs; median (min–max))", sync, cfg.rooms, cfg.secs, cfg.reps);
            println!("| store | appends/s | commits/s | ops per commit | append p50 ms | append p99 ms | snapshots |");
            println!("|---|---|---|---|---|---|---|");
            for s in &stores {
                let v = &res[s];
                let col = |f: &dyn Fn(&AppendResult) -> f64| med_range(&v.iter().map(f).collect::<Vec<_>>());
                println!("| {s} | {} | {} | {} | {} | {} | {} |",
                    col(&|r| r.appends_per_s), col(&|r| r.commits_per_s), col(&|r| r.mean_batch),
                    col(&|r| r.p50_ms), col(&|r| r.p99_ms), col(&|r| r.snapshots as f64));
            }
        }
    }

    if run("recovery") {
        let mut dirs = Vec::new();
        println!("\n## recovery populate ({} rooms)", cfg.rrooms);
        for s in &stores {
            let (dir, secs, live, entries) = populate_recovery(&cfg, s);
            println!("- {s}: wrote {:.1} MB live ({} log entries) in {:.1} s, dir {:.1} MB", live as f64 / 1e6, entries, secs, dir_size(&dir) as f64 / 1e6);
            dirs.push((s, dir));
        }
        for cold in [true, false] {
            let mut res: HashMap<&str, Vec<f64>> = HashMap::new();
            let mut read: HashMap<&str, (u64, u64)> = HashMap::new();
            for rep in 0..cfg.reps {
                for (s, dir) in &dirs {
                    let (t, bytes, entries) = run_recovery(dir, s, cfg.rrooms, cold);
                    eprintln!("recovery cold={cold} rep {rep} {s}: {:.3} s, {} bytes, {} entries, dir {:.1} MB", t, bytes, entries, dir_size(dir) as f64 / 1e6);
                    res.entry(s).or_default().push(t * 1e3);
                    read.insert(s, (bytes, entries));
                }
            }
            println!("\n## recovery, {} page cache ({} rooms; open + read every snapshot and tail; {} runs)",
                if cold { "cold (our files evicted)" } else { "warm" }, cfg.rrooms, cfg.reps);
            println!("| store | ms median (min–max) | MB read | log entries |");
            println!("|---|---|---|---|");
            for (s, _) in &dirs {
                println!("| {s} | {} | {:.1} | {} |", med_range(&res[*s]), read[*s].0 as f64 / 1e6, read[*s].1);
            }
        }
        for (_, dir) in &dirs {
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    if run("disk") {
        let mut res: HashMap<&str, Vec<DiskResult>> = HashMap::new();
        for rep in 0..cfg.reps {
            for s in &stores {
                let r = run_disk(&cfg, s);
                eprintln!("disk rep {rep} {s}: write {:.1} s, peak {:.1} MB, before {:.1} MB, after {:.1} MB (compact {:.2} s), live {:.1} MB",
                    r.write_s, r.peak as f64 / 1e6, r.before as f64 / 1e6, r.after as f64 / 1e6, r.compact_s, r.live as f64 / 1e6);
                res.entry(s).or_default().push(r);
            }
        }
        println!("\n## disk ({} rooms x {} snapshot cycles, {} runs; MB = 10^6 bytes, allocated blocks)", cfg.drooms, cfg.cycles, cfg.reps);
        println!("| store | live MB | peak MB | before compaction MB | after compaction MB | after / live | compaction s | write s |");
        println!("|---|---|---|---|---|---|---|---|");
        for s in &stores {
            let v = &res[s];
            let col = |f: &dyn Fn(&DiskResult) -> f64| med_range(&v.iter().map(f).collect::<Vec<_>>());
            println!("| {s} | {} | {} | {} | {} | {} | {} | {} |",
                col(&|r| r.live as f64 / 1e6), col(&|r| r.peak as f64 / 1e6), col(&|r| r.before as f64 / 1e6),
                col(&|r| r.after as f64 / 1e6), col(&|r| r.after as f64 / r.live as f64), col(&|r| r.compact_s), col(&|r| r.write_s));
        }
    }
}
