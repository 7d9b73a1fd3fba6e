//! The three stores behind one small interface, each used the way its docs suggest.

use crate::Op;
use std::path::{Path, PathBuf};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sync {
    /// fsync (fdatasync) before a commit returns
    Durable,
    /// commit reaches the OS (or the store's memory, for redb); fsync once a second by `sync_now`
    Interval,
}

pub trait Store: Send {
    /// One transaction for the whole group.
    fn commit(&mut self, ops: &[Op]);
    /// The once-a-second (or end-of-load) fsync.
    fn sync_now(&mut self);
    /// Read every room's latest snapshot and its log tail: (bytes, log entries, rooms).
    fn recover_all(&self) -> (u64, u64, u64);
    /// The store's own compaction.
    fn compact(&mut self);
}

pub fn open_store(kind: &str, dir: &Path, sync: Sync) -> Box<dyn Store> {
    match kind {
        "sqlite" => Box::new(Sqlite::open(dir, sync)),
        "redb" => Box::new(Redb::open(dir, sync)),
        "fjall" => Box::new(Fjall::open(dir, sync)),
        _ => panic!("unknown store {kind}: sqlite, redb or fjall"),
    }
}

// ------------------------------------------------------------------------------------ SQLite

pub struct Sqlite {
    conn: rusqlite::Connection,
    wal: PathBuf,
}

impl Sqlite {
    fn open(dir: &Path, sync: Sync) -> Self {
        let conn = rusqlite::Connection::open(dir.join("plaza.db")).unwrap();
        // must precede the first table for incremental vacuum to be possible
        conn.pragma_update(None, "auto_vacuum", "INCREMENTAL").unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        conn.pragma_update(None, "synchronous", if sync == Sync::Durable { "FULL" } else { "NORMAL" }).unwrap();
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS log (room INTEGER NOT NULL, n INTEGER NOT NULL, body BLOB NOT NULL,
                 PRIMARY KEY (room, n)) WITHOUT ROWID;
             CREATE TABLE IF NOT EXISTS snap (room INTEGER PRIMARY KEY, pos INTEGER NOT NULL, body BLOB NOT NULL);",
        )
        .unwrap();
        Sqlite { conn, wal: dir.join("plaza.db-wal") }
    }
}

impl Store for Sqlite {
    fn commit(&mut self, ops: &[Op]) {
        let tx = self.conn.transaction().unwrap();
        {
            let mut ins = tx.prepare_cached("INSERT INTO log (room, n, body) VALUES (?1, ?2, ?3)").unwrap();
            let mut snap = tx.prepare_cached("INSERT OR REPLACE INTO snap (room, pos, body) VALUES (?1, ?2, ?3)").unwrap();
            let mut trim = tx.prepare_cached("DELETE FROM log WHERE room = ?1 AND n <= ?2").unwrap();
            for op in ops {
                match op {
                    Op::Append { room, n, body } => {
                        ins.execute(rusqlite::params![*room as i64, *n as i64, body]).unwrap();
                    }
                    Op::Snapshot { room, pos, body, .. } => {
                        snap.execute(rusqlite::params![*room as i64, *pos as i64, body]).unwrap();
                        trim.execute(rusqlite::params![*room as i64, *pos as i64]).unwrap();
                    }
                }
            }
        }
        tx.commit().unwrap();
    }

    fn sync_now(&mut self) {
        // synchronous=NORMAL in WAL mode syncs the WAL only at checkpoints: fsync it ourselves
        if let Ok(f) = std::fs::File::open(&self.wal) {
            f.sync_data().unwrap();
        }
    }

    fn recover_all(&self) -> (u64, u64, u64) {
        let (mut bytes, mut entries, mut rooms) = (0u64, 0u64, 0u64);
        let mut snaps = self.conn.prepare("SELECT room, pos, body FROM snap ORDER BY room").unwrap();
        let mut tail = self.conn.prepare("SELECT n, body FROM log WHERE room = ?1 AND n > ?2 ORDER BY n").unwrap();
        let mut rows = snaps.query([]).unwrap();
        while let Some(r) = rows.next().unwrap() {
            let room: i64 = r.get(0).unwrap();
            let pos: i64 = r.get(1).unwrap();
            let body: Vec<u8> = r.get(2).unwrap();
            bytes += body.len() as u64;
            rooms += 1;
            let mut expect = pos + 1;
            let mut t = tail.query(rusqlite::params![room, pos]).unwrap();
            while let Some(e) = t.next().unwrap() {
                let n: i64 = e.get(0).unwrap();
                assert_eq!(n, expect, "gap in room {room}");
                expect += 1;
                let b: Vec<u8> = e.get(1).unwrap();
                bytes += b.len() as u64;
                entries += 1;
            }
        }
        (bytes, entries, rooms)
    }

    fn compact(&mut self) {
        self.conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())).unwrap();
        // The pragma frees one page per step (execute_batch would free one): run it to the end.
        let mut stmt = self.conn.prepare("PRAGMA incremental_vacuum").unwrap();
        let mut rows = stmt.query([]).unwrap();
        while rows.next().unwrap().is_some() {}
        drop(rows);
        drop(stmt);
        self.conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())).unwrap();
    }
}

// -------------------------------------------------------------------------------------- redb

const LOG: redb::TableDefinition<u128, &[u8]> = redb::TableDefinition::new("log");
const SNAP: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("snap");

fn key(room: u64, n: u64) -> u128 {
    ((room as u128) << 64) | n as u128
}

pub struct Redb {
    db: redb::Database,
    durable: bool,
}

impl Redb {
    fn open(dir: &Path, sync: Sync) -> Self {
        let db = redb::Database::create(dir.join("plaza.redb")).unwrap();
        let tx = db.begin_write().unwrap();
        tx.open_table(LOG).unwrap();
        tx.open_table(SNAP).unwrap();
        tx.commit().unwrap();
        Redb { db, durable: sync == Sync::Durable }
    }
}

impl Store for Redb {
    fn commit(&mut self, ops: &[Op]) {
        let mut tx = self.db.begin_write().unwrap();
        tx.set_durability(if self.durable { redb::Durability::Immediate } else { redb::Durability::None }).unwrap();
        {
            let mut log = tx.open_table(LOG).unwrap();
            let mut snap = tx.open_table(SNAP).unwrap();
            let mut v = Vec::new();
            for op in ops {
                match op {
                    Op::Append { room, n, body } => {
                        log.insert(key(*room, *n), body.as_slice()).unwrap();
                    }
                    Op::Snapshot { room, pos, trim_from, body } => {
                        v.clear();
                        v.extend_from_slice(&pos.to_be_bytes());
                        v.extend_from_slice(body);
                        snap.insert(*room, v.as_slice()).unwrap();
                        for n in *trim_from..=*pos {
                            log.remove(key(*room, n)).unwrap();
                        }
                    }
                }
            }
        }
        tx.commit().unwrap();
    }

    fn sync_now(&mut self) {
        // Durability::None commits are kept in memory until a Durability::Immediate commit
        let tx = self.db.begin_write().unwrap();
        tx.commit().unwrap();
    }

    fn recover_all(&self) -> (u64, u64, u64) {
        use redb::{ReadableDatabase, ReadableTable};
        let (mut bytes, mut entries, mut rooms) = (0u64, 0u64, 0u64);
        let tx = self.db.begin_read().unwrap();
        let log = tx.open_table(LOG).unwrap();
        let snap = tx.open_table(SNAP).unwrap();
        for r in snap.iter().unwrap() {
            let (k, v) = r.unwrap();
            let room = k.value();
            let v = v.value();
            let pos = u64::from_be_bytes(v[..8].try_into().unwrap());
            let body = v[8..].to_vec();
            bytes += body.len() as u64;
            rooms += 1;
            let mut expect = pos + 1;
            for e in log.range(key(room, pos + 1)..=key(room, u64::MAX)).unwrap() {
                let (k, v) = e.unwrap();
                assert_eq!(k.value() as u64, expect, "gap in room {room}");
                expect += 1;
                let b = v.value().to_vec();
                bytes += b.len() as u64;
                entries += 1;
            }
        }
        (bytes, entries, rooms)
    }

    fn compact(&mut self) {
        self.sync_now();
        while self.db.compact().unwrap() {}
    }
}

// ------------------------------------------------------------------------------------- fjall

pub struct Fjall {
    db: fjall::Database,
    log: fjall::Keyspace,
    snap: fjall::Keyspace,
    durable: bool,
}

impl Fjall {
    fn open(dir: &Path, sync: Sync) -> Self {
        // 64 MiB journal cap (the minimum; default 512 MiB) so the runs fit this machine's disk
        let db = fjall::Database::builder(dir.join("plaza.fjall"))
            .max_journaling_size(64 * 1024 * 1024)
            .open()
            .unwrap();
        let log = db.keyspace("log", fjall::KeyspaceCreateOptions::default).unwrap();
        // snapshots are large values: key-value separation, as fjall advises for blobs
        let snap = db
            .keyspace("snap", || {
                fjall::KeyspaceCreateOptions::default().with_kv_separation(Some(fjall::KvSeparationOptions::default()))
            })
            .unwrap();
        Fjall { db, log, snap, durable: sync == Sync::Durable }
    }
}

fn fkey(room: u64, n: u64) -> [u8; 16] {
    key(room, n).to_be_bytes()
}

impl Store for Fjall {
    fn commit(&mut self, ops: &[Op]) {
        let mut b = self.db.batch().durability(if self.durable { Some(fjall::PersistMode::SyncData) } else { None });
        for op in ops {
            match op {
                Op::Append { room, n, body } => b.insert(&self.log, fkey(*room, *n), body.as_slice()),
                Op::Snapshot { room, pos, trim_from, body } => {
                    let mut v = Vec::with_capacity(8 + body.len());
                    v.extend_from_slice(&pos.to_be_bytes());
                    v.extend_from_slice(body);
                    b.insert(&self.snap, room.to_be_bytes(), v);
                    for n in *trim_from..=*pos {
                        b.remove(&self.log, fkey(*room, n));
                    }
                }
            }
        }
        b.commit().unwrap();
    }

    fn sync_now(&mut self) {
        self.db.persist(fjall::PersistMode::SyncData).unwrap();
    }

    fn recover_all(&self) -> (u64, u64, u64) {
        let (mut bytes, mut entries, mut rooms) = (0u64, 0u64, 0u64);
        for g in self.snap.iter() {
            let (k, v) = g.into_inner().unwrap();
            let room = u64::from_be_bytes(k[..8].try_into().unwrap());
            let pos = u64::from_be_bytes(v[..8].try_into().unwrap());
            let body = v[8..].to_vec();
            bytes += body.len() as u64;
            rooms += 1;
            let mut expect = pos + 1;
            for e in self.log.range(fkey(room, pos + 1)..=fkey(room, u64::MAX)) {
                let (k, v) = e.into_inner().unwrap();
                assert_eq!(u64::from_be_bytes(k[8..].try_into().unwrap()), expect, "gap in room {room}");
                expect += 1;
                let b = v.to_vec();
                bytes += b.len() as u64;
                entries += 1;
            }
        }
        (bytes, entries, rooms)
    }

    fn compact(&mut self) {
        self.db.persist(fjall::PersistMode::SyncAll).unwrap();
        self.log.rotate_memtable_and_wait().unwrap();
        self.snap.rotate_memtable_and_wait().unwrap();
        self.log.major_compact().unwrap();
        self.snap.major_compact().unwrap();
    }
}
