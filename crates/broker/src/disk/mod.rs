//! A one-node [`Cluster`] kept in a data directory: embedded mode with
//! `data_dir`. Rooms, their logs since the latest snapshot, and the
//! snapshots live in SQLite (WAL mode) so that a restarted process has every
//! room back at the same seq and its clients resume with exactly what they
//! missed. The node runs the cluster-mode room path over it: commands are
//! appended, written, and only then applied and answered.
//!
//! One writer thread gathers whatever appends are waiting into one
//! transaction (group commit); with [`Fsync::Always`] that transaction is
//! on disk before any of its appends is acknowledged.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::Bytes;
use plaza_core::{Millis, RoomError, TicketBook, TicketGrant};
use rusqlite::{params, Connection, OptionalExtension};
use tokio::sync::oneshot;

mod webhooks;

use webhooks::{NewWebhook, WebhookQueue};

use crate::{
    new_ticket_token, AppendFuture, Cluster, ClusterError, IssuedTicket, LogEntry, LogListener,
    LogNotice, LogPosition, TicketStore,
};

/// When a write is on disk (the `fsync` setting).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fsync {
    /// Every commit is synced before its appends are acknowledged: an
    /// acknowledged command survives a power loss.
    Always,
    /// Commits reach the operating system before the acknowledgement (they
    /// survive the process's death) and are synced once a second: a power
    /// loss may lose the last second.
    Interval,
    /// Never synced by Plaza: the operating system writes when it likes.
    Off,
}

/// The store's file in the data directory.
pub const STORE_FILE: &str = "plaza.sqlite3";
/// The lock file that keeps a second process out of a data directory.
pub const LOCK_FILE: &str = "LOCK";

/// Pages the write-ahead log grows by between automatic checkpoints.
const WAL_PAGES_PER_CHECKPOINT: i64 = 8192;

/// Appends gathered into one transaction at most.
const GROUP: usize = 1024;

/// How often the writer gives freed pages back to the file system and
/// forgets expired tickets.
const MAINTENANCE_EVERY: Duration = Duration::from_secs(1);

/// Dead journal rows newer than a row still needed are left for a later
/// range while there are no more than this many (~25 MB of 370-byte rows).
const DEAD_ROWS_KEPT: usize = 65_536;

/// Journal rows deleted one by one per maintenance pass at most (a second's worth at
/// well over the writer's top rate): a pass never holds the writer for long.
const DEAD_ROWS_PER_PASS: usize = 100_000;

/// Freed pages returned to the file system per maintenance pass at most
/// (4 MiB of 4 KiB pages): compaction never holds the writer for long.
const VACUUM_PAGES: u32 = 1024;

/// Compaction leaves a file alone while less than a quarter of it, or less
/// than this many pages (1 MiB), is free.
const VACUUM_MIN_FREE_PAGES: i64 = 256;

/// An expired ticket is kept this long so that a late redemption is told
/// `ticket_expired` (as `TicketBook::purge`).
const EXPIRED_TICKET_KEPT_MS: Millis = 60_000;

/// A data directory opened by one process.
pub struct DiskBroker {
    node_id: String,
    state: Arc<Mutex<State>>,
    /// `None` once [`close`](DiskBroker::close)d.
    writes: Mutex<Option<mpsc::Sender<Write>>>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// A second connection, for reading snapshots beside the writer (WAL
    /// readers do not block it).
    reader: Arc<Mutex<Connection>>,
    /// Held for the process's life: the lock on the data directory.
    _lock: std::fs::File,
}

#[derive(Default)]
struct State {
    rooms: HashMap<String, Room>,
    subscriptions: HashMap<String, LogListener>,
    control: Option<LogListener>,
    /// Join tickets, as written: a ticket minted before a restart is
    /// redeemable after it, once.
    tickets: TicketBook,
    /// Webhook queues by target.
    webhooks: HashMap<String, WebhookQueue>,
    /// Whether the store refused a write: commands that need it are refused
    /// until a write succeeds again.
    failed: Option<String>,
}

struct Room {
    meta: Bytes,
    /// Position of the last entry handed to the writer.
    next_n: u64,
    /// Timestamp of that entry.
    last_ts: Millis,
    /// Committed entries after the snapshot.
    log: VecDeque<LogEntry>,
    /// The latest snapshot's position, and its bytes until they are
    /// committed: a committed snapshot is read from the store when a room is
    /// hosted, so idle rooms' states take no memory.
    snapshot: (u64, Option<Bytes>),
    members: Option<(u64, u64)>,
    /// The last log position whose webhook events are queued.
    webhook_cursor: u64,
}

enum Write {
    Create {
        id: String,
        meta: Bytes,
        snapshot: Bytes,
    },
    Delete {
        id: String,
    },
    Append {
        room: String,
        entry: LogEntry,
        done: oneshot::Sender<Result<LogPosition, ClusterError>>,
    },
    Snapshot {
        room: String,
        n: u64,
        bytes: Bytes,
        done: oneshot::Sender<Result<(), ClusterError>>,
    },
    /// A ticket minted (`used: false`) or redeemed (`used: true`).
    Ticket {
        token: String,
        grant: TicketGrant,
        expires_at: Millis,
        used: bool,
        done: oneshot::Sender<Result<(), ClusterError>>,
    },
    /// Webhook records to queue and the room's webhook cursor to move.
    Webhooks {
        room: String,
        cursor: Option<u64>,
        records: Vec<NewWebhook>,
        done: oneshot::Sender<Result<(), ClusterError>>,
    },
    /// Webhook records delivered (or given up).
    WebhookAck {
        target: String,
        seqs: Vec<u64>,
        done: oneshot::Sender<Result<(), ClusterError>>,
    },
    /// Answered once everything before it is committed.
    Barrier(oneshot::Sender<()>),
    /// Runs a compaction pass now, then answers.
    Compact(oneshot::Sender<()>),
}

fn unavailable(e: impl std::fmt::Display) -> ClusterError {
    ClusterError::Unavailable(format!("data_dir: {e}"))
}

fn now_ms() -> Millis {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as Millis)
}

impl DiskBroker {
    /// Opens (creating) the data directory `dir` for node `node_id`, loading
    /// every room. Fails when another process holds the directory, or when
    /// the store cannot be read (the message names the file).
    pub fn open(dir: &Path, fsync: Fsync, node_id: &str) -> Result<Arc<DiskBroker>, String> {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("data_dir {}: cannot create it: {e}", dir.display()))?;
        let lock_path = dir.join(LOCK_FILE);
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| format!("{}: {e}", lock_path.display()))?;
        if lock.try_lock().is_err() {
            return Err(format!(
                "data_dir {} is in use by another plaza process (it holds {})",
                dir.display(),
                lock_path.display()
            ));
        }
        let path = dir.join(STORE_FILE);
        let conn = open_store(&path, fsync).map_err(|e| format!("{}: {e}", path.display()))?;
        let (rooms, journal) = load(&conn).map_err(|e| format!("{}: {e}", path.display()))?;
        let tickets =
            load_tickets(&conn, now_ms()).map_err(|e| format!("{}: {e}", path.display()))?;
        let webhooks = load_webhooks(&conn).map_err(|e| format!("{}: {e}", path.display()))?;
        let state = Arc::new(Mutex::new(State {
            rooms,
            tickets,
            webhooks,
            ..State::default()
        }));
        let reader = Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .and_then(|c| {
                // A WAL reader may briefly meet the writer's lock (a
                // checkpoint resetting the log): it waits rather than fails.
                c.busy_timeout(Duration::from_secs(5))?;
                Ok(c)
            })
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let (tx, rx) = mpsc::channel();
        let writer_state = state.clone();
        let writer = std::thread::Builder::new()
            .name("plaza-data-dir".into())
            .spawn(move || write_loop(conn, rx, writer_state, journal, fsync, path))
            .map_err(|e| format!("cannot start the data_dir writer: {e}"))?;
        Ok(Arc::new(DiskBroker {
            node_id: node_id.to_owned(),
            state,
            writes: Mutex::new(Some(tx)),
            writer: Mutex::new(Some(writer)),
            reader: Arc::new(Mutex::new(reader)),
            _lock: lock,
        }))
    }

    fn state(&self) -> Result<MutexGuard<'_, State>, ClusterError> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = &state.failed {
            return Err(unavailable(e));
        }
        Ok(state)
    }

    fn send(&self, w: Write) -> Result<(), ClusterError> {
        self.writes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .ok_or_else(|| unavailable("the data directory is closed"))?
            .send(w)
            .map_err(|_| unavailable("the writer stopped"))
    }

    /// Writes everything sent before it, then stops the writer and closes
    /// the store: the commands that need it are refused from then on. The
    /// directory's lock is released when the broker is dropped.
    pub async fn close(&self) {
        self.writes.lock().unwrap_or_else(|p| p.into_inner()).take();
        let writer = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(writer) = writer {
            let _ = tokio::task::spawn_blocking(move || writer.join()).await;
        }
    }

    /// Runs one background compaction pass now (the writer runs one every
    /// second) and waits for it: journal rows that no room needs are
    /// deleted (here all of them, up to 100,000), expired tickets are
    /// forgotten and up to 4 MiB of freed pages go back to the file system.
    pub async fn compact(&self) {
        let (tx, rx) = oneshot::channel();
        if self.send(Write::Compact(tx)).is_ok() {
            let _ = rx.await;
        }
    }

    /// Waits until everything written so far is committed.
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.send(Write::Barrier(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}

fn open_store(path: &Path, fsync: Fsync) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    // Pages freed by trimmed logs and replaced snapshots go back to the file
    // system in the background (`maintain`). The mode is fixed when the
    // first table is made; a store made without it is rebuilt once.
    let vacuum: i64 = conn.pragma_query_value(None, "auto_vacuum", |r| r.get(0))?;
    if vacuum != 2 {
        conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")?;
        conn.execute_batch("VACUUM")?;
    }
    conn.pragma_update(None, "journal_mode", "WAL")?;
    // A checkpoint truncates the write-ahead log to this size: a burst does
    // not leave a large file behind.
    conn.pragma_update(None, "journal_size_limit", 64 * 1024 * 1024)?;
    // Checkpoints copy each page once however often commits rewrote it (the
    // journal's last page, a busy room's snapshot): fewer, larger ones copy
    // less. 8,192 pages is 32 MiB of log between them.
    conn.pragma_update(None, "wal_autocheckpoint", WAL_PAGES_PER_CHECKPOINT)?;
    let sync = match fsync {
        Fsync::Always => "FULL",
        Fsync::Interval => "NORMAL",
        Fsync::Off => "OFF",
    };
    conn.pragma_update(None, "synchronous", sync)?;
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS rooms (
            id TEXT PRIMARY KEY, meta BLOB NOT NULL,
            snap_n INTEGER NOT NULL, snap BLOB NOT NULL);
         CREATE TABLE IF NOT EXISTS health (k TEXT PRIMARY KEY, v BLOB NOT NULL);
         CREATE TABLE IF NOT EXISTS journal (
            id INTEGER PRIMARY KEY, room TEXT NOT NULL, n INTEGER NOT NULL,
            ts INTEGER NOT NULL, payload BLOB NOT NULL);
         CREATE TABLE IF NOT EXISTS tickets (
            token TEXT PRIMARY KEY, room TEXT NOT NULL, name TEXT NOT NULL,
            platform TEXT NOT NULL, expires_at INTEGER NOT NULL, used INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS webhooks (
            target TEXT NOT NULL, seq INTEGER NOT NULL, id TEXT NOT NULL, room TEXT NOT NULL,
            body BLOB NOT NULL, ts INTEGER NOT NULL, PRIMARY KEY (target, seq)) WITHOUT ROWID;
         CREATE TABLE IF NOT EXISTS webhook_cursors (room TEXT PRIMARY KEY, upto INTEGER NOT NULL);",
    )?;
    migrate_log_to_journal(&conn)?;
    Ok(conn)
}

/// Stores written before the journal kept the log in a table keyed by
/// (room, n): its entries move to the journal, in the same order per room.
fn migrate_log_to_journal(conn: &Connection) -> rusqlite::Result<()> {
    let old: Option<String> = conn
        .query_row(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'log'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    if old.is_some() {
        conn.execute_batch(
            "BEGIN;
             INSERT INTO journal (room, n, ts, payload)
                 SELECT room, n, ts, payload FROM log ORDER BY room, n;
             DROP TABLE log;
             COMMIT;",
        )?;
    }
    Ok(())
}

/// Where each room's log entries are in the journal, oldest first, and
/// which journal rows no room needs any more: the writer's own index (the
/// journal has none, so that appends only ever touch its last page).
#[derive(Default)]
struct JournalRows {
    rooms: HashMap<String, VecDeque<(u64, i64)>>,
    dead: Vec<i64>,
}

impl JournalRows {
    /// Rows of `room` up to `n` are dead: a snapshot covers them.
    fn trim(&mut self, room: &str, n: u64) {
        if let Some(rows) = self.rooms.get_mut(room) {
            while rows.front().is_some_and(|(m, _)| *m <= n) {
                self.dead.extend(rows.pop_front().map(|(_, id)| id));
            }
        }
    }

    /// Notes what a committed batch changed: where its appends went (`ids`,
    /// in the batch's order), what its snapshots cover, which rooms went.
    fn record(&mut self, batch: &[Write], ids: &[i64]) {
        let mut ids = ids.iter();
        for w in batch {
            match w {
                Write::Append { room, entry, .. } => {
                    if let Some(id) = ids.next() {
                        let rows = self.rooms.entry(room.clone()).or_default();
                        rows.push_back((entry.n, *id));
                    }
                }
                Write::Snapshot { room, n, .. } => self.trim(room, *n),
                Write::Delete { id } => self.forget(id),
                _ => {}
            }
        }
    }

    /// Every row of `room` is dead: the room is deleted.
    fn forget(&mut self, room: &str) {
        if let Some(rows) = self.rooms.remove(room) {
            self.dead.extend(rows.into_iter().map(|(_, id)| id));
        }
    }
}

fn load(conn: &Connection) -> rusqlite::Result<(HashMap<String, Room>, JournalRows)> {
    let mut rooms = HashMap::new();
    let mut stmt = conn.prepare("SELECT id, meta, snap_n FROM rooms")?;
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        let id: String = row.get(0)?;
        let meta: Vec<u8> = row.get(1)?;
        let snap_n: i64 = row.get(2)?;
        rooms.insert(
            id,
            Room {
                meta: meta.into(),
                next_n: snap_n as u64,
                last_ts: 0,
                log: VecDeque::new(),
                snapshot: (snap_n as u64, None),
                members: None,
                webhook_cursor: 0,
            },
        );
    }
    let mut journal = JournalRows::default();
    // Appended in order: each room's entries come in the order of their n.
    let mut stmt = conn.prepare("SELECT id, room, n, ts, payload FROM journal ORDER BY id")?;
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        let id: i64 = row.get(0)?;
        let room: String = row.get(1)?;
        let (n, ts): (i64, i64) = (row.get(2)?, row.get(3)?);
        let (n, ts) = (n as u64, ts as u64);
        match rooms.get_mut(&room) {
            // Only the run of entries that follows the snapshot gap-free;
            // the rest (covered by a snapshot, or of a deleted room) was left
            // for compaction.
            Some(r) if n == r.next_n + 1 => {
                let payload: Vec<u8> = row.get(4)?;
                r.next_n = n;
                r.last_ts = ts;
                r.log.push_back(LogEntry {
                    n,
                    ts,
                    payload: payload.into(),
                });
                journal.rooms.entry(room).or_default().push_back((n, id));
            }
            _ => journal.dead.push(id),
        }
    }
    let mut stmt = conn.prepare("SELECT room, upto FROM webhook_cursors")?;
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        let room: String = row.get(0)?;
        let upto: i64 = row.get(1)?;
        if let Some(r) = rooms.get_mut(&room) {
            r.webhook_cursor = upto as u64;
        }
    }
    Ok((rooms, journal))
}

/// Every target's queued webhook records, in order. What the last run read
/// and did not acknowledge is unread again: delivered at least once.
fn load_webhooks(conn: &Connection) -> rusqlite::Result<HashMap<String, WebhookQueue>> {
    let mut queues: HashMap<String, WebhookQueue> = HashMap::new();
    let mut stmt =
        conn.prepare("SELECT target, seq, id, room, body, ts FROM webhooks ORDER BY target, seq")?;
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        let target: String = row.get(0)?;
        let seq = row.get::<_, i64>(1)? as u64;
        let body: Vec<u8> = row.get(4)?;
        let queue = queues.entry(target).or_default();
        queue.next = queue.next.max(seq);
        queue.unread.push_back((
            seq,
            crate::QueuedWebhook {
                stream_id: seq.to_string(),
                id: row.get(2)?,
                room: row.get(3)?,
                body: body.into(),
                ts: row.get::<_, i64>(5)? as u64,
            },
        ));
    }
    Ok(queues)
}

fn load_tickets(conn: &Connection, now: Millis) -> rusqlite::Result<TicketBook> {
    let mut book = TicketBook::default();
    let mut stmt = conn.prepare(
        "SELECT token, room, name, platform, expires_at, used FROM tickets WHERE expires_at > ?1",
    )?;
    let kept_from = now.saturating_sub(EXPIRED_TICKET_KEPT_MS) as i64;
    let mut rows = stmt.query(params![kept_from])?;
    while let Some(row) = rows.next()? {
        let grant = TicketGrant {
            room: row.get(1)?,
            name: row.get(2)?,
            platform: row.get(3)?,
        };
        let expires_at: i64 = row.get(4)?;
        let used: bool = row.get(5)?;
        book.restore(row.get(0)?, grant, expires_at as Millis, used);
    }
    Ok(book)
}

/// Background compaction, bounded per pass: deletes dead journal rows
/// (`all_dead_rows`: not only those a range takes), forgets expired tickets
/// and gives freed pages back to the file system. Failures are left to the next
/// write to report.
fn maintain(conn: &mut Connection, journal: &mut JournalRows, all_dead_rows: bool) {
    delete_dead_rows(conn, journal, all_dead_rows);
    let before = now_ms().saturating_sub(EXPIRED_TICKET_KEPT_MS) as i64;
    let _ = conn.execute(
        "DELETE FROM tickets WHERE expires_at <= ?1",
        params![before],
    );
    // Pages freed by replaced snapshots and trimmed logs are reused by the
    // next writes: giving them back only to grow the file again would cost
    // the writer for nothing. Only a file that is mostly free (rooms
    // deleted, a burst gone) is shrunk.
    let pages = |name: &str| conn.pragma_query_value(None, name, |r| r.get::<_, i64>(0));
    let (Ok(free), Ok(total)) = (pages("freelist_count"), pages("page_count")) else {
        return;
    };
    if free < VACUUM_MIN_FREE_PAGES || free * 4 < total {
        return;
    }
    // The pragma frees one page per step: run it to the end.
    let _ = conn
        .prepare(&format!("PRAGMA incremental_vacuum({VACUUM_PAGES})"))
        .and_then(|mut stmt| {
            let mut rows = stmt.query([])?;
            while rows.next()?.is_some() {}
            Ok(())
        });
}

/// Deletes journal rows that no room needs (covered by a snapshot, or of a
/// deleted room). Every row older than the oldest one a room still needs is
/// dead: those go in one range. Dead rows above it (rooms that moved on
/// while an older one idles) go one by one, in journal order, once there
/// are many of them. A failure keeps them for the next pass: they cost only
/// space.
fn delete_dead_rows(conn: &mut Connection, journal: &mut JournalRows, all: bool) {
    if journal.dead.is_empty() {
        return;
    }
    journal.dead.sort_unstable();
    let oldest_live = journal
        .rooms
        .values()
        .filter_map(|rows| rows.front().map(|(_, id)| *id))
        .min()
        .unwrap_or(i64::MAX);
    let below = journal.dead.partition_point(|id| *id < oldest_live);
    let one_by_one = if all || journal.dead.len() - below > DEAD_ROWS_KEPT {
        (journal.dead.len() - below).min(DEAD_ROWS_PER_PASS)
    } else {
        0
    };
    if below == 0 && one_by_one == 0 {
        return;
    }
    let deleted = (|| {
        let tx = conn.transaction()?;
        if below > 0 {
            exec(
                &tx,
                "DELETE FROM journal WHERE id < ?1",
                params![journal.dead[below - 1] + 1],
            )?;
        }
        for id in &journal.dead[below..below + one_by_one] {
            exec(&tx, "DELETE FROM journal WHERE id = ?1", params![id])?;
        }
        tx.commit()
    })();
    if deleted.is_ok() {
        journal.dead.drain(..below + one_by_one);
    }
}

/// The writer thread: gathers waiting writes into one transaction, commits,
/// then makes the appends visible and answers them.
fn write_loop(
    mut conn: Connection,
    rx: mpsc::Receiver<Write>,
    state: Arc<Mutex<State>>,
    mut journal: JournalRows,
    fsync: Fsync,
    path: PathBuf,
) {
    let mut last_sync = Instant::now();
    let mut last_maintenance = Instant::now();
    loop {
        if last_maintenance.elapsed() >= MAINTENANCE_EVERY {
            maintain(&mut conn, &mut journal, false);
            last_maintenance = Instant::now();
        }
        let first = match rx.recv_timeout(MAINTENANCE_EVERY) {
            Ok(w) => w,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                recover(&conn, &state, &path);
                if fsync == Fsync::Interval {
                    // A checkpoint syncs the WAL: at most a second is lost
                    // on power loss.
                    let _ = conn.execute_batch("PRAGMA wal_checkpoint(PASSIVE)");
                    last_sync = Instant::now();
                }
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        };
        let mut batch = vec![first];
        while batch.len() < GROUP {
            match rx.try_recv() {
                Ok(w) => batch.push(w),
                Err(_) => break,
            }
        }
        // After a failed write, what was queued behind it is refused too:
        // its positions follow the ones given back.
        let failed = state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .failed
            .clone();
        let result = match failed {
            Some(e) => Err(e),
            None => commit(&mut conn, &batch),
        };
        if let Ok(ids) = &result {
            journal.record(&batch, ids);
        }
        let result = result.map(|_| ());
        if fsync == Fsync::Interval && last_sync.elapsed() >= Duration::from_secs(1) {
            let _ = conn.execute_batch("PRAGMA wal_checkpoint(PASSIVE)");
            last_sync = Instant::now();
        }
        let mut compactions = Vec::new();
        let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = &result {
            if st.failed.is_none() {
                tracing::error!(file = %path.display(), error = %e,
                    "data_dir write failed: commands that need it are refused until a write succeeds");
                st.failed = Some(format!("{}: {e}", path.display()));
            }
            // Positions handed out for what was not written are given back:
            // the next append after recovery follows the last one written.
            for r in st.rooms.values_mut() {
                r.next_n = r.log.back().map_or(r.snapshot.0, |e| e.n);
            }
            for w in &batch {
                if let Write::Create { id, .. } = w {
                    st.rooms.remove(id);
                }
            }
        }
        for w in batch {
            match w {
                Write::Append { room, entry, done } => {
                    if result.is_err() {
                        let _ = done.send(Err(unavailable(st.failed.clone().unwrap_or_default())));
                        continue;
                    }
                    let position = LogPosition {
                        n: entry.n,
                        ts: entry.ts,
                    };
                    if let Some(r) = st.rooms.get_mut(&room) {
                        r.log.push_back(entry.clone());
                    }
                    if let Some(l) = st.subscriptions.get(&room) {
                        l(LogNotice::Entry(entry));
                    }
                    let _ = done.send(Ok(position));
                }
                Write::Webhooks {
                    room,
                    cursor,
                    records,
                    done,
                } => {
                    if result.is_ok() {
                        if let (Some(c), Some(r)) = (cursor, st.rooms.get_mut(&room)) {
                            r.webhook_cursor = r.webhook_cursor.max(c);
                        }
                        for w in records {
                            let queue = st.webhooks.entry(w.target).or_default();
                            queue.unread.push_back((w.seq, w.record));
                        }
                    }
                    let _ = done.send(result.clone().map_err(unavailable));
                }
                Write::Snapshot { room, n, done, .. } => {
                    if result.is_ok() {
                        if let Some(r) = st.rooms.get_mut(&room) {
                            if r.snapshot.0 == n {
                                r.snapshot.1 = None;
                            }
                        }
                    }
                    let _ = done.send(result.clone().map_err(unavailable));
                }
                Write::Create { id, .. } => {
                    if result.is_ok() {
                        if let Some(r) = st.rooms.get_mut(&id) {
                            if r.snapshot.0 == 0 {
                                r.snapshot.1 = None;
                            }
                        }
                    }
                }
                Write::Ticket { done, .. } | Write::WebhookAck { done, .. } => {
                    let _ = done.send(result.clone().map_err(unavailable));
                }
                Write::Barrier(done) => {
                    let _ = done.send(());
                }
                Write::Compact(done) => compactions.push(done),
                Write::Delete { .. } => {}
            }
        }
        drop(st);
        if !compactions.is_empty() {
            maintain(&mut conn, &mut journal, true);
            last_maintenance = Instant::now();
            for done in compactions {
                let _ = done.send(());
            }
        }
    }
}

/// After a failed write (a full disk, say): tries a small write, and takes
/// commands again once one succeeds.
fn recover(conn: &Connection, state: &Mutex<State>, path: &Path) {
    if state
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .failed
        .is_none()
    {
        return;
    }
    let probe = conn.execute(
        "INSERT OR REPLACE INTO health (k, v) VALUES ('probe', zeroblob(65536))",
        [],
    );
    if probe.is_ok() {
        let _ = conn.execute("DELETE FROM health WHERE k = 'probe'", []);
        tracing::info!(file = %path.display(), "data_dir writable again");
        state.lock().unwrap_or_else(|p| p.into_inner()).failed = None;
    }
}

/// Runs `sql` through the connection's statement cache: the writer runs
/// the same few statements for every append, so each is parsed once.
fn exec(conn: &Connection, sql: &str, params: impl rusqlite::Params) -> rusqlite::Result<usize> {
    conn.prepare_cached(sql)?.execute(params)
}

/// Writes `batch` in one transaction; answers the journal ids of its
/// appends, in order.
fn commit(conn: &mut Connection, batch: &[Write]) -> Result<Vec<i64>, String> {
    let tx = conn.transaction().map_err(|e| e.to_string())?;
    let mut ids = Vec::with_capacity(batch.len());
    for w in batch {
        let r = match w {
            Write::Create { id, meta, snapshot } => exec(
                &tx,
                "INSERT OR REPLACE INTO rooms (id, meta, snap_n, snap) VALUES (?1, ?2, 0, ?3)",
                params![id, &meta[..], &snapshot[..]],
            ),
            // The room's journal rows are left to compaction.
            Write::Delete { id } => tx
                .execute("DELETE FROM rooms WHERE id = ?1", params![id])
                .and_then(|_| {
                    exec(
                        &tx,
                        "DELETE FROM webhook_cursors WHERE room = ?1",
                        params![id],
                    )
                }),
            Write::Append { room, entry, .. } => exec(
                &tx,
                "INSERT INTO journal (room, n, ts, payload) VALUES (?1, ?2, ?3, ?4)",
                params![room, entry.n as i64, entry.ts as i64, &entry.payload[..]],
            )
            .inspect(|_| ids.push(tx.last_insert_rowid())),
            // The journal rows it covers are left to compaction: deleting
            // them here would write a page per room in every commit.
            Write::Snapshot { room, n, bytes, .. } => exec(
                &tx,
                "UPDATE rooms SET snap_n = ?2, snap = ?3 WHERE id = ?1 AND snap_n < ?2",
                params![room, *n as i64, &bytes[..]],
            ),
            Write::Ticket {
                token,
                grant,
                expires_at,
                used,
                ..
            } => exec(
                &tx,
                "INSERT OR REPLACE INTO tickets (token, room, name, platform, expires_at, used)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    token,
                    grant.room,
                    grant.name,
                    grant.platform,
                    *expires_at as i64,
                    used
                ],
            ),
            Write::Webhooks {
                room,
                cursor,
                records,
                ..
            } => write_webhooks(&tx, room, *cursor, records),
            Write::WebhookAck { target, seqs, .. } => seqs.iter().try_fold(0, |n, seq| {
                exec(
                    &tx,
                    "DELETE FROM webhooks WHERE target = ?1 AND seq = ?2",
                    params![target, *seq as i64],
                )
                .map(|d| n + d)
            }),
            Write::Barrier(_) | Write::Compact(_) => Ok(0),
        };
        r.map_err(|e| e.to_string())?;
    }
    tx.commit().map_err(|e| e.to_string())?;
    Ok(ids)
}

fn write_webhooks(
    tx: &rusqlite::Transaction<'_>,
    room: &str,
    cursor: Option<u64>,
    records: &[NewWebhook],
) -> rusqlite::Result<usize> {
    for w in records {
        exec(
            tx,
            "INSERT OR REPLACE INTO webhooks (target, seq, id, room, body, ts)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                w.target,
                w.seq as i64,
                w.record.id,
                w.record.room,
                &w.record.body[..],
                w.record.ts as i64
            ],
        )?;
    }
    if let Some(upto) = cursor {
        exec(
            tx,
            "INSERT INTO webhook_cursors (room, upto) VALUES (?1, ?2)
             ON CONFLICT (room) DO UPDATE SET upto = max(upto, excluded.upto)",
            params![room, upto as i64],
        )?;
    }
    Ok(records.len())
}

#[async_trait]
impl Cluster for DiskBroker {
    fn node_id(&self) -> &str {
        &self.node_id
    }

    async fn create_room(
        &self,
        id: &str,
        meta: Bytes,
        snapshot: Bytes,
    ) -> Result<bool, ClusterError> {
        {
            let mut st = self.state()?;
            if st.rooms.contains_key(id) {
                return Ok(false);
            }
            st.rooms.insert(
                id.to_owned(),
                Room {
                    meta: meta.clone(),
                    next_n: 0,
                    last_ts: 0,
                    log: VecDeque::new(),
                    snapshot: (0, Some(snapshot.clone())),
                    members: None,
                    webhook_cursor: 0,
                },
            );
            self.send(Write::Create {
                id: id.to_owned(),
                meta,
                snapshot,
            })?;
        }
        self.flush().await;
        self.state().map(|_| true)
    }

    async fn room_meta(&self, id: &str) -> Result<Option<Bytes>, ClusterError> {
        Ok(self.state()?.rooms.get(id).map(|r| r.meta.clone()))
    }

    async fn list_rooms(&self) -> Result<Vec<(String, Bytes)>, ClusterError> {
        let st = self.state()?;
        Ok(st
            .rooms
            .iter()
            .map(|(id, r)| (id.clone(), r.meta.clone()))
            .collect())
    }

    async fn delete_room(&self, id: &str) -> Result<bool, ClusterError> {
        let existed = {
            let mut st = self.state()?;
            let existed = st.rooms.remove(id).is_some();
            if existed {
                self.send(Write::Delete { id: id.to_owned() })?;
            }
            existed
        };
        self.flush().await;
        Ok(existed)
    }

    async fn set_room_members(&self, id: &str, members: u64, at: u64) -> Result<(), ClusterError> {
        if let Some(room) = self.state()?.rooms.get_mut(id) {
            if room.members.is_none_or(|(_, recorded)| at > recorded) {
                room.members = Some((members, at));
            }
        }
        Ok(())
    }

    async fn room_members(&self, ids: &[String]) -> Result<Vec<u64>, ClusterError> {
        let st = self.state()?;
        Ok(ids
            .iter()
            .map(|id| {
                st.rooms
                    .get(id)
                    .and_then(|r| r.members)
                    .map_or(0, |(m, _)| m)
            })
            .collect())
    }

    fn append(&self, room: &str, payload: Bytes) -> AppendFuture {
        let (done, answer) = oneshot::channel();
        let queued = (|| {
            // Under the state's lock: the call order is the log order.
            let mut st = self.state()?;
            let r = st
                .rooms
                .get_mut(room)
                .ok_or_else(|| ClusterError::RoomNotFound(room.to_owned()))?;
            r.next_n += 1;
            r.last_ts = now_ms().max(r.last_ts);
            let entry = LogEntry {
                n: r.next_n,
                ts: r.last_ts,
                payload,
            };
            self.send(Write::Append {
                room: room.to_owned(),
                entry,
                done,
            })
        })();
        Box::pin(async move {
            queued?;
            answer
                .await
                .unwrap_or_else(|_| Err(unavailable("the writer stopped")))
        })
    }

    async fn read(
        &self,
        room: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<LogEntry>, ClusterError> {
        let st = self.state()?;
        let r = st
            .rooms
            .get(room)
            .ok_or_else(|| ClusterError::RoomNotFound(room.to_owned()))?;
        if r.log.front().is_some_and(|e| e.n > after + 1) {
            return Err(ClusterError::Trimmed(room.to_owned()));
        }
        Ok(r.log
            .iter()
            .filter(|e| e.n > after)
            .take(limit)
            .cloned()
            .collect())
    }

    async fn store_snapshot(
        &self,
        room: &str,
        n: u64,
        snapshot: Bytes,
    ) -> Result<(), ClusterError> {
        let (done, answer) = oneshot::channel();
        {
            let mut st = self.state()?;
            let r = st
                .rooms
                .get_mut(room)
                .ok_or_else(|| ClusterError::RoomNotFound(room.to_owned()))?;
            if n <= r.snapshot.0 {
                return Ok(());
            }
            r.snapshot = (n, Some(snapshot.clone()));
            while r.log.front().is_some_and(|e| e.n <= n) {
                r.log.pop_front();
            }
            self.send(Write::Snapshot {
                room: room.to_owned(),
                n,
                bytes: snapshot,
                done,
            })?;
        }
        answer
            .await
            .unwrap_or_else(|_| Err(unavailable("the writer stopped")))
    }

    async fn load_snapshot(&self, room: &str) -> Result<Option<(u64, Bytes)>, ClusterError> {
        match self.state()?.rooms.get(room) {
            None => return Ok(None),
            Some(Room {
                snapshot: (n, Some(bytes)),
                ..
            }) => return Ok(Some((*n, bytes.clone()))),
            Some(_) => {}
        }
        // Committed: the store has it, or a newer one (whose log entries
        // are the ones still held, so either is consistent with the log).
        let reader = self.reader.clone();
        let id = room.to_owned();
        tokio::task::spawn_blocking(move || {
            let conn = reader.lock().unwrap_or_else(|p| p.into_inner());
            conn.query_row(
                "SELECT snap_n, snap FROM rooms WHERE id = ?1",
                params![id],
                |row| {
                    let n: i64 = row.get(0)?;
                    let bytes: Vec<u8> = row.get(1)?;
                    Ok((n as u64, Bytes::from(bytes)))
                },
            )
            .optional()
        })
        .await
        .map_err(|e| unavailable(format!("snapshot read stopped: {e}")))?
        .map_err(unavailable)
    }

    async fn subscribe(&self, room: &str, listener: LogListener) -> Result<(), ClusterError> {
        self.state()?
            .subscriptions
            .insert(room.to_owned(), listener);
        Ok(())
    }

    async fn unsubscribe(&self, room: &str) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.subscriptions.remove(room);
    }

    async fn publish_control(&self, payload: Bytes) -> Result<(), ClusterError> {
        let listener = self.state()?.control.clone();
        if let Some(l) = listener {
            l(LogNotice::Entry(LogEntry {
                n: 0,
                ts: 0,
                payload,
            }));
        }
        Ok(())
    }

    async fn subscribe_control(&self, listener: LogListener) -> Result<(), ClusterError> {
        self.state()?.control = Some(listener);
        Ok(())
    }

    /// Only this process reads its data directory's snapshots.
    fn snapshot_format(&self) -> crate::SnapshotFormat {
        crate::SnapshotFormat::MessagePack
    }

    fn webhook_streams(&self) -> Option<&dyn crate::WebhookStreams> {
        Some(self)
    }

    async fn nodes_alive(&self, nodes: &[String]) -> Result<Vec<bool>, ClusterError> {
        // One process: the members of an earlier run are on a dead node.
        Ok(nodes.iter().map(|n| *n == self.node_id).collect())
    }

    async fn leave(&self) {
        self.flush().await;
    }

    async fn ready(&self) -> bool {
        self.state().is_ok()
    }
}

impl DiskBroker {
    /// Records a ticket's new state and waits until it is committed.
    async fn write_ticket(
        &self,
        token: String,
        grant: TicketGrant,
        expires_at: Millis,
        used: bool,
    ) -> Result<(), RoomError> {
        let (done, answer) = oneshot::channel();
        self.send(Write::Ticket {
            token,
            grant,
            expires_at,
            used,
            done,
        })?;
        answer
            .await
            .unwrap_or_else(|_| Err(unavailable("the writer stopped")))
            .map_err(RoomError::from)
    }
}

/// Tickets live in the data directory with the rooms: one minted before a
/// restart is redeemable after it, and one redeemed before it is `ticket_used`
/// after it. Both answers wait for the commit, as appends do.
#[async_trait]
impl TicketStore for DiskBroker {
    fn kind(&self) -> &'static str {
        "data_dir"
    }

    async fn issue_ticket(
        &self,
        grant: TicketGrant,
        ttl_ms: Millis,
        now: Millis,
    ) -> Result<IssuedTicket, RoomError> {
        let ticket = new_ticket_token();
        let expires_at = now.saturating_add(ttl_ms);
        {
            let mut st = self.state()?;
            // Purging on issue keeps the book bounded by the issue rate × ticket
            // life; the writer forgets the same ones on disk.
            st.tickets.purge_now_and_then(now);
            st.tickets.issue(ticket.clone(), grant.clone(), expires_at);
        }
        self.write_ticket(ticket.clone(), grant, expires_at, false)
            .await?;
        Ok(IssuedTicket { ticket, expires_at })
    }

    async fn redeem_ticket(&self, ticket: &str, now: Millis) -> Result<TicketGrant, RoomError> {
        let (grant, expires_at) = {
            let mut st = self.state()?;
            let grant = st.tickets.redeem(ticket, now)?;
            (grant, st.tickets.expires_at(ticket).unwrap_or(now))
        };
        self.write_ticket(ticket.to_owned(), grant.clone(), expires_at, true)
            .await?;
        Ok(grant)
    }

    async fn ready(&self) -> bool {
        self.state().is_ok()
    }
}

impl std::fmt::Debug for DiskBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskBroker")
            .field("node_id", &self.node_id)
            .finish_non_exhaustive()
    }
}

/// The store file's size and how much of it is free pages (bytes), as
/// SQLite counts them: what compaction has yet to give back.
pub fn store_size(dir: &Path) -> Result<(u64, u64), String> {
    let conn = Connection::open(dir.join(STORE_FILE)).map_err(|e| e.to_string())?;
    let pragma = |name: &str| -> Result<u64, String> {
        conn.pragma_query_value(None, name, |r| r.get::<_, i64>(0))
            .map(|v| v as u64)
            .map_err(|e| e.to_string())
    };
    let page = pragma("page_size")?;
    Ok((
        pragma("page_count")? * page,
        pragma("freelist_count")? * page,
    ))
}

/// Reads the log entry count of a data directory's store (for tests and
/// tools): rooms, and journal rows held (those no room needs any more
/// until compaction deletes them).
pub fn store_counts(dir: &Path) -> Result<(u64, u64), String> {
    let conn = Connection::open(dir.join(STORE_FILE)).map_err(|e| e.to_string())?;
    let rooms: i64 = conn
        .query_row("SELECT count(*) FROM rooms", [], |r| r.get(0))
        .optional()
        .map_err(|e| e.to_string())?
        .unwrap_or(0);
    let log: i64 = conn
        .query_row("SELECT count(*) FROM journal", [], |r| r.get(0))
        .map_err(|e| e.to_string())?;
    Ok((rooms as u64, log as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn journal_ids(conn: &Connection) -> Vec<i64> {
        let mut stmt = conn.prepare("SELECT id FROM journal ORDER BY id").unwrap();
        let ids = stmt.query_map([], |r| r.get(0)).unwrap();
        ids.map(Result::unwrap).collect()
    }

    /// Rows older than every row still needed go in one range; newer dead
    /// rows wait for a later range until there are too many of them.
    #[test]
    fn dead_rows_go_by_range_and_one_by_one_when_many() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = open_store(&dir.path().join(STORE_FILE), Fsync::Off).unwrap();
        let tx = conn.transaction().unwrap();
        // Room "idle" holds row 3; "busy" has every other row, all dead.
        let total = 3 + DEAD_ROWS_KEPT as i64 + 10;
        for id in 1..=total {
            let room = if id == 3 { "idle" } else { "busy" };
            tx.execute(
                "INSERT INTO journal (id, room, n, ts, payload) VALUES (?1, ?2, ?1, 0, x'00')",
                params![id, room],
            )
            .unwrap();
        }
        tx.commit().unwrap();
        let mut journal = JournalRows::default();
        journal
            .rooms
            .insert("idle".into(), VecDeque::from([(3, 3)]));
        journal.dead = (1..=total).filter(|id| *id != 3).rev().collect();
        // Few dead rows above the idle room's: only the range below it goes.
        let mut few = JournalRows {
            rooms: journal.rooms.clone(),
            dead: journal.dead[journal.dead.len() - 100..].to_vec(),
        };
        delete_dead_rows(&mut conn, &mut few, false);
        assert_eq!(few.dead.len(), 98, "rows 4..=101 wait");
        assert_eq!(journal_ids(&conn)[..3], [3, 4, 5]);
        // Past DEAD_ROWS_KEPT, they go one by one (the range ones are gone).
        journal.dead.retain(|id| *id > 3);
        delete_dead_rows(&mut conn, &mut journal, false);
        assert!(journal.dead.is_empty());
        assert_eq!(journal_ids(&conn), [3]);
        // The last live row becomes dead: everything goes in a range.
        journal.trim("idle", 3);
        delete_dead_rows(&mut conn, &mut journal, false);
        assert!(journal_ids(&conn).is_empty());
        assert!(journal.dead.is_empty());
    }
}
