//! The three stores behind one small interface, each holding Plaza's data_dir tables (rooms with
//! their latest snapshot; log entries keyed by (room, n)) and each committing durably: fsync
//! before `commit` returns.

use crate::{room_id, Op};
use std::collections::HashMap;
use std::path::Path;

/// A room as recovery holds it: the latest snapshot and the gap-free log after it.
#[derive(Default)]
pub struct Room {
    pub snap_n: u64,
    pub snap: Vec<u8>,
    /// (n, ts, payload)
    pub log: Vec<(u64, u64, Vec<u8>)>,
}

pub type Rooms = HashMap<String, Room>;

/// Plaza's load: only the run of entries that follows the snapshot gap-free is kept.
fn push_entry(rooms: &mut Rooms, room: &str, n: u64, ts: u64, payload: &[u8]) {
    if let Some(r) = rooms.get_mut(room) {
        if n == r.snap_n + r.log.len() as u64 + 1 {
            r.log.push((n, ts, payload.to_vec()));
        }
    }
}

pub trait Store: Send {
    /// One durable transaction for the whole group.
    fn commit(&mut self, ops: &[Op]);
    /// Recovery after open: every room's snapshot and log into memory.
    fn load(&self) -> Rooms;
    /// The store's own compaction, run to the end.
    fn compact(&mut self);
}

pub fn open_store(kind: &str, dir: &Path) -> Box<dyn Store> {
    match kind {
        "sqlite" => Box::new(Sqlite::open(dir)),
        "redb" => Box::new(Redb::open(dir)),
        "fjall" => Box::new(Fjall::open(dir)),
        _ => panic!("unknown store {kind}: sqlite, redb or fjall"),
    }
}

fn be(v: &[u8]) -> u64 {
    u64::from_be_bytes(v[..8].try_into().unwrap())
}

/// `prefix` (8 bytes, big-endian) followed by `body`: redb's and fjall's values.
fn prefixed(prefix: u64, body: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + body.len());
    v.extend_from_slice(&prefix.to_be_bytes());
    v.extend_from_slice(body);
    v
}

// ------------------------------------------------------------------------------------ SQLite

/// As `crates/broker/src/disk/mod.rs` (`open_store`, `commit`, `load`) with fsync = always.
pub struct Sqlite {
    conn: rusqlite::Connection,
}

impl Sqlite {
    fn open(dir: &Path) -> Self {
        let conn = rusqlite::Connection::open(dir.join("plaza.sqlite3")).unwrap();
        // fixed when the first table is made (a no-op on an existing store)
        conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")
            .unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        conn.pragma_update(None, "journal_size_limit", 64 * 1024 * 1024)
            .unwrap();
        conn.pragma_update(None, "synchronous", "FULL").unwrap();
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS rooms (
                id TEXT PRIMARY KEY, meta BLOB NOT NULL,
                snap_n INTEGER NOT NULL, snap BLOB NOT NULL);
             CREATE TABLE IF NOT EXISTS log (
                room TEXT NOT NULL, n INTEGER NOT NULL, ts INTEGER NOT NULL, payload BLOB NOT NULL,
                PRIMARY KEY (room, n)) WITHOUT ROWID;",
        )
        .unwrap();
        Sqlite { conn }
    }
}

impl Store for Sqlite {
    fn commit(&mut self, ops: &[Op]) {
        use rusqlite::params;
        let tx = self.conn.transaction().unwrap();
        for op in ops {
            match op {
                Op::Create { room, snap } => tx
                    .prepare_cached(
                        "INSERT OR REPLACE INTO rooms (id, meta, snap_n, snap) VALUES (?1, ?2, 0, ?3)",
                    )
                    .unwrap()
                    .execute(params![room_id(*room), &b"{}"[..], snap]),
                Op::Append { room, n, ts, payload } => tx
                    .prepare_cached(
                        "INSERT OR REPLACE INTO log (room, n, ts, payload) VALUES (?1, ?2, ?3, ?4)",
                    )
                    .unwrap()
                    .execute(params![room_id(*room), *n as i64, *ts as i64, payload]),
                Op::Snapshot { room, n, snap, .. } => tx
                    .prepare_cached(
                        "UPDATE rooms SET snap_n = ?2, snap = ?3 WHERE id = ?1 AND snap_n < ?2",
                    )
                    .unwrap()
                    .execute(params![room_id(*room), *n as i64, snap])
                    .and_then(|_| {
                        tx.prepare_cached("DELETE FROM log WHERE room = ?1 AND n <= ?2")
                            .unwrap()
                            .execute(params![room_id(*room), *n as i64])
                    }),
            }
            .unwrap();
        }
        tx.commit().unwrap();
    }

    fn load(&self) -> Rooms {
        let mut rooms = Rooms::new();
        let mut stmt = self
            .conn
            .prepare("SELECT id, snap_n, snap FROM rooms")
            .unwrap();
        let mut rows = stmt.query([]).unwrap();
        while let Some(row) = rows.next().unwrap() {
            let room = Room {
                snap_n: row.get::<_, i64>(1).unwrap() as u64,
                snap: row.get(2).unwrap(),
                log: Vec::new(),
            };
            rooms.insert(row.get(0).unwrap(), room);
        }
        let mut stmt = self
            .conn
            .prepare("SELECT room, n, ts, payload FROM log ORDER BY room, n")
            .unwrap();
        let mut rows = stmt.query([]).unwrap();
        while let Some(row) = rows.next().unwrap() {
            let room = row.get_ref(0).unwrap().as_str().unwrap();
            let (n, ts): (i64, i64) = (row.get(1).unwrap(), row.get(2).unwrap());
            let payload = row.get_ref(3).unwrap().as_blob().unwrap();
            push_entry(&mut rooms, room, n as u64, ts as u64, payload);
        }
        rooms
    }

    fn compact(&mut self) {
        let checkpoint = |c: &rusqlite::Connection| {
            c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                .unwrap()
        };
        checkpoint(&self.conn);
        // The pragma frees one page per step: run it to the end (as Plaza's `maintain`).
        let mut stmt = self.conn.prepare("PRAGMA incremental_vacuum").unwrap();
        let mut rows = stmt.query([]).unwrap();
        while rows.next().unwrap().is_some() {}
        drop(rows);
        drop(stmt);
        checkpoint(&self.conn);
    }
}

// -------------------------------------------------------------------------------------- redb

/// room -> snap_n (8 bytes) + snapshot
const ROOMS: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("rooms");
/// (room, n) -> ts (8 bytes) + payload
const LOG: redb::TableDefinition<(&str, u64), &[u8]> = redb::TableDefinition::new("log");

pub struct Redb {
    db: redb::Database,
}

impl Redb {
    fn open(dir: &Path) -> Self {
        let db = redb::Database::create(dir.join("plaza.redb")).unwrap();
        let tx = db.begin_write().unwrap();
        tx.open_table(ROOMS).unwrap();
        tx.open_table(LOG).unwrap();
        tx.commit().unwrap();
        Redb { db }
    }
}

impl Store for Redb {
    fn commit(&mut self, ops: &[Op]) {
        let mut tx = self.db.begin_write().unwrap();
        // the default, spelled out: fsync (fdatasync) before commit returns
        tx.set_durability(redb::Durability::Immediate).unwrap();
        {
            let mut rooms = tx.open_table(ROOMS).unwrap();
            let mut log = tx.open_table(LOG).unwrap();
            for op in ops {
                match op {
                    Op::Create { room, snap } => {
                        rooms
                            .insert(room_id(*room).as_str(), prefixed(0, snap).as_slice())
                            .unwrap();
                    }
                    Op::Append {
                        room,
                        n,
                        ts,
                        payload,
                    } => {
                        let id = room_id(*room);
                        log.insert((id.as_str(), *n), prefixed(*ts, payload).as_slice())
                            .unwrap();
                    }
                    Op::Snapshot {
                        room,
                        n,
                        from,
                        snap,
                    } => {
                        let id = room_id(*room);
                        rooms
                            .insert(id.as_str(), prefixed(*n, snap).as_slice())
                            .unwrap();
                        for k in *from..=*n {
                            log.remove((id.as_str(), k)).unwrap();
                        }
                    }
                }
            }
        }
        tx.commit().unwrap();
    }

    fn load(&self) -> Rooms {
        use redb::{ReadableDatabase, ReadableTable};
        let mut out = Rooms::new();
        let tx = self.db.begin_read().unwrap();
        for row in tx.open_table(ROOMS).unwrap().iter().unwrap() {
            let (k, v) = row.unwrap();
            let v = v.value();
            let room = Room {
                snap_n: be(v),
                snap: v[8..].to_vec(),
                log: Vec::new(),
            };
            out.insert(k.value().to_owned(), room);
        }
        for row in tx.open_table(LOG).unwrap().iter().unwrap() {
            let (k, v) = row.unwrap();
            let ((room, n), v) = (k.value(), v.value());
            push_entry(&mut out, room, n, be(v), &v[8..]);
        }
        out
    }

    fn compact(&mut self) {
        while self.db.compact().unwrap() {}
    }
}

// ------------------------------------------------------------------------------------- fjall

pub struct Fjall {
    db: fjall::Database,
    rooms: fjall::Keyspace,
    log: fjall::Keyspace,
}

impl Fjall {
    fn open(dir: &Path) -> Self {
        // Journal cap as SQLite's journal_size_limit (64 MiB, fjall's minimum; default 512 MiB).
        let db = fjall::Database::builder(dir.join("plaza.fjall"))
            .max_journaling_size(64 * 1024 * 1024)
            .open()
            .unwrap();
        // snapshots are large values: key-value separation, as fjall advises for blobs
        let rooms = db
            .keyspace("rooms", || {
                fjall::KeyspaceCreateOptions::default()
                    .with_kv_separation(Some(fjall::KvSeparationOptions::default()))
            })
            .unwrap();
        let log = db
            .keyspace("log", fjall::KeyspaceCreateOptions::default)
            .unwrap();
        Fjall { db, rooms, log }
    }
}

/// room id (fixed width) + n, big-endian: sorted by (room, n)
fn log_key(room: u32, n: u64) -> Vec<u8> {
    let mut k = room_id(room).into_bytes();
    k.extend_from_slice(&n.to_be_bytes());
    k
}

impl Store for Fjall {
    fn commit(&mut self, ops: &[Op]) {
        // fsync the journal before commit returns (SQLite's FULL: fsync; redb: fdatasync)
        let mut b = self
            .db
            .batch()
            .durability(Some(fjall::PersistMode::SyncAll));
        for op in ops {
            match op {
                Op::Create { room, snap } => {
                    b.insert(&self.rooms, room_id(*room), prefixed(0, snap))
                }
                Op::Append {
                    room,
                    n,
                    ts,
                    payload,
                } => b.insert(&self.log, log_key(*room, *n), prefixed(*ts, payload)),
                Op::Snapshot {
                    room,
                    n,
                    from,
                    snap,
                } => {
                    b.insert(&self.rooms, room_id(*room), prefixed(*n, snap));
                    for k in *from..=*n {
                        b.remove(&self.log, log_key(*room, k));
                    }
                }
            }
        }
        b.commit().unwrap();
    }

    fn load(&self) -> Rooms {
        let mut out = Rooms::new();
        for g in self.rooms.iter() {
            let (k, v) = g.into_inner().unwrap();
            let room = Room {
                snap_n: be(&v),
                snap: v[8..].to_vec(),
                log: Vec::new(),
            };
            out.insert(String::from_utf8(k.to_vec()).unwrap(), room);
        }
        for g in self.log.iter() {
            let (k, v) = g.into_inner().unwrap();
            let (room, n) = k.split_at(k.len() - 8);
            let room = std::str::from_utf8(room).unwrap();
            push_entry(&mut out, room, be(n), be(&v), &v[8..]);
        }
        out
    }

    fn compact(&mut self) {
        // flush the memtables (their journals can go), then merge every table into the last level
        self.rooms.rotate_memtable_and_wait().unwrap();
        self.log.rotate_memtable_and_wait().unwrap();
        self.rooms.major_compact().unwrap();
        self.log.major_compact().unwrap();
        self.db.persist(fjall::PersistMode::SyncAll).unwrap();
    }
}
