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
    }
    // The writer thread lets go of the lock once the broker is dropped.
    let mut disk = None;
    for _ in 0..100 {
        match DiskBroker::open(dir.path(), Fsync::Always, "n3") {
            Ok(d) => {
                disk = Some(d);
                break;
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
        }
    }
    let disk = disk.expect("the directory opens again");
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
