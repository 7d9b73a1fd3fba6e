//! The data directory's broker: what is written is read back after the
//! directory is opened again; snapshots trim the log; one process at a time.

use bytes::Bytes;
use plaza_broker::{Cluster, ClusterError, DiskBroker, Fsync};

fn payload(i: u64) -> Bytes {
    Bytes::from(format!("entry {i}"))
}

#[tokio::test]
async fn rooms_logs_and_snapshots_come_back_after_reopening() {
    let dir = tempfile::tempdir().unwrap();
    {
        let disk = DiskBroker::open(dir.path(), Fsync::Always, "n1").unwrap();
        assert!(disk
            .create_room("r", "meta".into(), "snap0".into())
            .await
            .unwrap());
        assert!(!disk
            .create_room("r", "other".into(), "x".into())
            .await
            .unwrap());
        let appends: Vec<_> = (1..=10).map(|i| disk.append("r", payload(i))).collect();
        for (i, a) in appends.into_iter().enumerate() {
            assert_eq!(a.await.unwrap().n, i as u64 + 1, "call order is log order");
        }
        disk.store_snapshot("r", 4, "snap4".into()).await.unwrap();
        // The snapshot's entries are trimmed: reading from before it says so.
        assert!(matches!(
            disk.read("r", 0, 100).await,
            Err(ClusterError::Trimmed(_))
        ));
        let rest = disk.read("r", 4, 100).await.unwrap();
        assert_eq!(
            rest.iter().map(|e| e.n).collect::<Vec<_>>(),
            (5..=10).collect::<Vec<_>>()
        );
        // A second opener of the same directory is refused.
        let e = DiskBroker::open(dir.path(), Fsync::Always, "n2").unwrap_err();
        assert!(e.contains("in use by another plaza process"), "{e}");
        assert!(disk
            .create_room("gone", "m".into(), "s".into())
            .await
            .unwrap());
        assert!(disk.delete_room("gone").await.unwrap());
        disk.close().await;
        let refused = disk.append("r", payload(11)).await.unwrap_err();
        assert!(refused.to_string().contains("closed"), "{refused}");
    }
    // Closed and dropped: the lock is released.
    let disk =
        DiskBroker::open(dir.path(), Fsync::Always, "n3").expect("the directory opens again");
    let rooms = disk.list_rooms().await.unwrap();
    assert_eq!(rooms.len(), 1, "the deleted room stays deleted");
    assert_eq!(rooms[0].1, Bytes::from("meta"));
    assert_eq!(
        disk.load_snapshot("r").await.unwrap(),
        Some((4, "snap4".into()))
    );
    let rest = disk.read("r", 4, 100).await.unwrap();
    assert_eq!(rest.len(), 6);
    assert_eq!(rest[5].payload, payload(10));
    // Positions go on from where they were; time does not run back.
    let next = disk.append("r", payload(11)).await.unwrap();
    assert_eq!(next.n, 11);
    assert!(next.ts >= rest[5].ts);
    // Every earlier node is dead to this one.
    assert_eq!(
        disk.nodes_alive(&["n1".into(), "n3".into()]).await.unwrap(),
        vec![false, true]
    );
}

/// Snapshots trim the logs and deleted rooms go: compaction gives the freed
/// pages back, so the file shrinks to about what is still held.
#[tokio::test]
async fn compaction_gives_trimmed_and_deleted_data_back() {
    let dir = tempfile::tempdir().unwrap();
    let disk = DiskBroker::open(dir.path(), Fsync::Off, "n1").unwrap();
    let big = |i: u64| Bytes::from(format!("{i:>2048}"));
    for r in 0..8 {
        let room = format!("r{r}");
        disk.create_room(&room, "m".into(), "s".into())
            .await
            .unwrap();
        let appends: Vec<_> = (1..=200).map(|i| disk.append(&room, big(i))).collect();
        for a in appends {
            a.await.unwrap();
        }
    }
    let (grown, _) = plaza_broker::store_size(dir.path()).unwrap();
    assert!(
        grown > 8 * 200 * 2048,
        "{grown} bytes hold 3.2 MB of entries"
    );
    for r in 0..8 {
        let room = format!("r{r}");
        if r % 2 == 0 {
            assert!(disk.delete_room(&room).await.unwrap());
        } else {
            disk.store_snapshot(&room, 200, "small".into())
                .await
                .unwrap();
        }
    }
    disk.flush().await;
    // A commit only appends to the journal: the rows that snapshots and
    // deletions leave behind wait for compaction.
    assert_eq!(
        plaza_broker::store_counts(dir.path()).unwrap(),
        (4, 8 * 200)
    );
    // Each pass gives back at most 4 MiB, so that it never holds the
    // writer long: this takes two.
    disk.compact().await;
    assert_eq!(plaza_broker::store_counts(dir.path()).unwrap(), (4, 0));
    let (size, free) = plaza_broker::store_size(dir.path()).unwrap();
    // (Deleting the rows may itself take or free a page or two.)
    let shrunk = grown - size;
    assert!(
        shrunk.abs_diff(4 * 1024 * 1024) <= 16 * 4096,
        "one bounded pass: {shrunk} bytes given back"
    );
    assert!(
        free + 4 * 1024 * 1024 > grown / 2,
        "the trimmed rows' pages are free: {free} of {size}"
    );
    disk.compact().await;
    let (size, free) = plaza_broker::store_size(dir.path()).unwrap();
    assert_eq!(
        free, 0,
        "every free page given back ({size} bytes, {grown} before)"
    );
    assert!(size < grown / 10, "{size} bytes left of {grown}");
    // A little free space (under 1 MiB) is left alone: the next writes reuse it.
    disk.store_snapshot("r1", 300, Bytes::from(vec![b'x'; 40_000]))
        .await
        .unwrap();
    disk.store_snapshot("r1", 400, "small".into())
        .await
        .unwrap();
    disk.flush().await;
    let (before, free) = plaza_broker::store_size(dir.path()).unwrap();
    assert!(free > 0 && free < 1024 * 1024, "{free} of {before} free");
    disk.compact().await;
    assert_eq!(
        plaza_broker::store_size(dir.path()).unwrap(),
        (before, free),
        "under 1 MiB free: not shrunk"
    );
    // What is left is what is held.
    assert_eq!(disk.list_rooms().await.unwrap().len(), 4);
    assert_eq!(disk.load_snapshot("r1").await.unwrap().unwrap().0, 400);
}

/// The durable webhook queue's contract, as Redis streams keep it: each
/// record once by log position, dropped at `max`, read once, gone when
/// acknowledged, and what was read but not acknowledged is back after a
/// reopening.
#[tokio::test]
async fn webhook_queues_keep_each_event_once_and_survive_reopening() {
    use plaza_broker::{WebhookRecord, WebhookStreams};
    let dir = tempfile::tempdir().unwrap();
    let record = |position: u64, max: u64| WebhookRecord {
        position,
        target: "t".into(),
        max,
        id: format!("r:1:{position}"),
        room: "r".into(),
        body: Bytes::from(format!("{{\"seq\":{position}}}")),
        ts: 1,
    };
    {
        let disk = DiskBroker::open(dir.path(), Fsync::Always, "n1").unwrap();
        disk.create_room("r", "m".into(), "s".into()).await.unwrap();
        let dropped = disk
            .enqueue("r", 2, &[record(1, 10), record(2, 10)])
            .await
            .unwrap();
        assert!(dropped.is_empty());
        // A second replica's call for the same entries queues nothing.
        disk.enqueue("r", 2, &[record(2, 10)]).await.unwrap();
        assert_eq!(disk.depth("t").await.unwrap(), 2);
        // At `max` the record is dropped, and its target named.
        let dropped = disk.enqueue("r", 3, &[record(3, 2)]).await.unwrap();
        assert_eq!(dropped, vec!["t".to_owned()]);
        let read = WebhookStreams::read(&*disk, "t", 10).await.unwrap();
        assert_eq!(
            read.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
            ["r:1:1", "r:1:2"]
        );
        assert!(
            WebhookStreams::read(&*disk, "t", 10)
                .await
                .unwrap()
                .is_empty(),
            "read once"
        );
        disk.ack("t", &[read[0].stream_id.clone()]).await.unwrap();
        assert_eq!(disk.depth("t").await.unwrap(), 1);
        assert!(disk.lagging_rooms().await.unwrap().is_empty());
        disk.close().await;
    }
    let disk =
        DiskBroker::open(dir.path(), Fsync::Always, "n2").expect("the directory opens again");
    let again = WebhookStreams::read(&*disk, "t", 10).await.unwrap();
    assert_eq!(
        again.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["r:1:2"],
        "read, not acknowledged: sent again"
    );
    // The cursor came back too: entry 2 is not queued again.
    disk.enqueue("r", 2, &[record(2, 10)]).await.unwrap();
    assert_eq!(disk.depth("t").await.unwrap(), 1);
}

/// A store written before the journal (its log in a table keyed by room and
/// position) and before incremental auto-vacuum opens with the same rooms
/// and logs, and its covered entries go at the next compaction.
#[tokio::test]
async fn a_store_with_the_old_log_table_is_migrated() {
    let dir = tempfile::tempdir().unwrap();
    {
        let old = rusqlite::Connection::open(dir.path().join(plaza_broker::STORE_FILE)).unwrap();
        old.execute_batch(
            "CREATE TABLE rooms (id TEXT PRIMARY KEY, meta BLOB NOT NULL,
                 snap_n INTEGER NOT NULL, snap BLOB NOT NULL);
             CREATE TABLE log (room TEXT NOT NULL, n INTEGER NOT NULL, ts INTEGER NOT NULL,
                 payload BLOB NOT NULL, PRIMARY KEY (room, n)) WITHOUT ROWID;
             INSERT INTO rooms VALUES ('b', CAST('mb' AS BLOB), 2, CAST('snap-b' AS BLOB)),
                 ('a', CAST('ma' AS BLOB), 0, CAST('snap-a' AS BLOB));",
        )
        .unwrap();
        // Written room by room, out of the rooms' order, as the old key kept them.
        for (room, n) in [("b", 1), ("b", 2), ("b", 3), ("b", 4), ("a", 1), ("a", 2)] {
            old.execute(
                "INSERT INTO log VALUES (?1, ?2, ?3, ?4)",
                rusqlite::params![room, n, 100 + n, format!("{room}{n}").as_bytes()],
            )
            .unwrap();
        }
    }
    let disk = DiskBroker::open(dir.path(), Fsync::Always, "n1").unwrap();
    let payloads = |entries: Vec<plaza_broker::LogEntry>| {
        entries
            .into_iter()
            .map(|e| (e.n, String::from_utf8(e.payload.to_vec()).unwrap()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        payloads(disk.read("b", 2, 10).await.unwrap()),
        [(3, "b3".into()), (4, "b4".into())]
    );
    assert_eq!(
        payloads(disk.read("a", 0, 10).await.unwrap()),
        [(1, "a1".into()), (2, "a2".into())]
    );
    assert_eq!(disk.append("b", payload(5)).await.unwrap().n, 5);
    disk.compact().await;
    assert_eq!(
        plaza_broker::store_counts(dir.path()).unwrap(),
        (2, 5),
        "b's entries 1 and 2 (under its snapshot) are gone"
    );
    let conn = rusqlite::Connection::open(dir.path().join(plaza_broker::STORE_FILE)).unwrap();
    let tables: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE name = 'log'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(tables, 0, "the old table is dropped");
    // Made without incremental auto-vacuum (SQLite's default), the store
    // was rebuilt with it: compaction can give pages back.
    let vacuum: i64 = conn
        .pragma_query_value(None, "auto_vacuum", |r| r.get(0))
        .unwrap();
    assert_eq!(vacuum, 2, "auto_vacuum = INCREMENTAL");
}
